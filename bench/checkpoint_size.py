"""How large is a checkpoint of a model holding N features?  The figure behind --max-model-features.

    python3 bench/checkpoint_size.py                    # 50,000 features, every variant, with and without --standardize
    python3 bench/checkpoint_size.py --features 100000 --name-length 20 30

The Kafka checkpoint store writes each checkpoint as one record of at most
16 MiB (service/app.py, CHECKPOINT_TOPIC_CONFIG): past it every checkpoint
fails and the committed offsets stop moving.  This builds each model the
service can run, learned on labeled events until it holds N features with
random names of the given lengths (full-precision weights: random values,
random labels, so about half the events update), and prints the size of the
checkpoint the service would write (perceptron_stream.state.checkpoint.encode_checkpoint).

Per feature the state holds its name and one float per weight vector (two for
averaged and pocket); --standardize adds the scaler's count, mean and
variance, each with the name again: the largest model is averaged or pocket
with --standardize, about 4 names and 5 numbers per feature.
"""

from __future__ import annotations

import argparse
import random
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perceptron_stream.learning import VARIANTS, make_learner
from perceptron_stream.state.checkpoint import Checkpoint, encode_checkpoint

LIMIT = 16 * 1024 * 1024
ALPHABET = string.ascii_lowercase + string.digits + "_=/:.-"


def names(n: int, lengths: tuple[int, int], seed: int = 7) -> list[str]:
    """n distinct names of random lengths in [lo, hi] (a serial number keeps them distinct)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tag = f"#{i}"
        length = rng.randint(*lengths)
        out.append("".join(rng.choices(ALPHABET, k=max(length - len(tag), 1))) + tag)
    return out


def checkpoint_bytes(
    variant: str, standardize: bool, features: list[str], hash_features: int = 0, seed: int = 11
) -> tuple[int, int]:
    """(bytes of the checkpoint, features the model holds)."""
    rng = random.Random(seed)
    m = make_learner(variant, 0.5 if variant == "margin" else 0.0, standardize, None, hash_features)
    per = 1000
    for start in range(0, len(features), per // 2):
        x = {k: rng.gauss(0, 3) for k in features[start : start + per // 2]}
        for k in rng.sample(features[: start + per // 2], min(per // 2, start + per // 2)):
            x[k] = rng.gauss(0, 3)
        m.step(x, rng.choice((-1, 1)))
    cp = Checkpoint(
        seq=123456,
        positions={("points", 0): 10**9},
        model=m.to_state(),
        dimension=None,
        meta={
            "variant": variant,
            "margin": 0.0,
            "standardize": standardize,
            "input_topic": "points",
            "max_model_features": len(features),
            "hash_features": hash_features,
        },
        created=time.time(),
    )
    return len(encode_checkpoint(cp)), len(m.weights)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", type=int, default=50_000)
    ap.add_argument("--name-length", type=int, nargs=2, default=(20, 30), metavar=("MIN", "MAX"))
    ap.add_argument(
        "--hash-features", type=int, default=0, help="hash into this many buckets (names are then bucket numbers)"
    )
    args = ap.parse_args(argv)
    features = names(args.features, tuple(args.name_length))
    mean = sum(map(len, features)) / len(features)
    print(
        f"{args.features:,} features, names of {args.name_length[0]}-{args.name_length[1]} characters (mean {mean:.1f})"
        + (f", hashed into {args.hash_features:,} buckets" if args.hash_features else "")
    )
    print(f"{'variant':10} {'standardize':>11} {'held':>8} {'checkpoint':>12} {'per feature':>12} {'of 16 MiB':>10}")
    for standardize in (False, True):
        for variant in VARIANTS:
            size, held = checkpoint_bytes(variant, standardize, features, args.hash_features)
            print(
                f"{variant:10} {standardize!s:>11} {held:>8,} {size / 2**20:>8.2f} MiB {size / held:>10.0f} B {size / LIMIT:>9.0%}"
            )


if __name__ == "__main__":
    main()
