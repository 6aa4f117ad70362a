"""The decoder's worst case: cost per byte of hostile messages, beside a valid event of the same size.

    python3 bench/decoder.py                          # the table of bench/README.md
    python3 bench/decoder.py --sizes 1000,100000 --rounds 3      # a quick look
    python3 bench/decoder.py --tree /tmp/old          # the decoder of another source tree

For each size (bytes of the message value), every shape below is built to
that size and decoded by ``perceptron_stream.wire.inputs.Decoder`` (max_message_bytes
1,048,576, max_features ``--max-features``, default 100,000 so that the
valid dense event of 1 MB is accepted; the service's default is 10,000).
A shape is one way a producer (or an attacker) can make the decoder work:
many bad elements, each of which the model may report, strings, nested
objects, invalid JSON or UTF-8 found only at the end, extra keys, and so on.

Each message is decoded ``--rounds`` times in batches (at least ~5 ms per
batch); its cost is the best batch's time per call, so that a shared
machine's load spikes do not count. "ns/B" is that cost per byte; "× valid"
divides it by the ns/B of the valid dense event of the same size
(``{"id": "...", "x": [17-digit floats], "y": 1}``, the fast path), measured
in the same run. The worst row of each size is marked. The garbage collector
is on and the start-up objects frozen, as in the service (service/app.py).
Nothing is asserted: tests never time anything.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name → (what it is, builder of a message of about n bytes)
SHAPES: dict[str, tuple[str, Callable[[int], bytes]]] = {}


def shape(name: str, what: str):
    def register(build):
        SHAPES[name] = (what, build)
        return build

    return register


def fill(prefix: bytes, item: Callable[[int], bytes], suffix: bytes, n: int, sep: bytes = b",") -> bytes:
    """prefix + item(0) sep item(1) ... + suffix, as many items as fit in about n bytes (at least one)."""
    parts: list[bytes] = []
    size, i = len(prefix) + len(suffix), 0
    while True:
        part = item(i)
        if parts and size + len(part) + len(sep) > n:
            break
        parts.append(part)
        size += len(part) + (len(sep) if i else 0)
        i += 1
    return prefix + sep.join(parts) + suffix


def same(value: bytes) -> Callable[[int], bytes]:
    return lambda _i: value


# The references: valid events.
@shape("valid x", "the reference: a valid dense event, 17-digit floats")
def _valid_x(n):
    return fill(b'{"id": "c-1042", "x": [', lambda i: b"0.%017d" % (12345678901234567 + i * 7919), b'], "y": 1}', n)


@shape("valid features", "a valid event of named features, 17-digit floats")
def _valid_features(n):
    return fill(
        b'{"id": "c-1042", "features": {',
        lambda i: b'"f%d": 0.%017d' % (i, 12345678901234567 + i * 7919),
        b'}, "y": 1}',
        n,
    )


@shape("valid x ints", "a valid dense event of 0/1 features")
def _valid_ints(n):
    return fill(b'{"x": [', lambda i: b"01"[i % 2 : i % 2 + 1], b"]}", n)


@shape("valid x + extra", "a valid dense event with a key of the producer's own (the model's path)")
def _valid_extra(n):
    return fill(b'{"source": "sensor-7", "x": [', lambda i: b"0.%017d" % (12345678901234567 + i * 7919), b"]}", n)


# Many bad elements: one error each, if the model collects them all.
shape("x [[],…]", "x of empty lists (the issue's message)")(lambda n: fill(b'{"x": [', same(b"[]"), b"]}", n))
shape("x [{},…]", "x of empty objects")(lambda n: fill(b'{"x": [', same(b"{}"), b"]}", n))
shape("x [[[1]]],…]", "x of nested lists")(lambda n: fill(b'{"x": [', same(b"[[[1]]]"), b"]}", n))
shape('x ["a",…]', "x of strings")(lambda n: fill(b'{"x": [', same(b'"a"'), b"]}", n))
shape('x ["1.5",…]', "x of numbers in strings")(lambda n: fill(b'{"x": [', same(b'"1.5"'), b"]}", n))
shape("x [null,…]", "x of nulls")(lambda n: fill(b'{"x": [', same(b"null"), b"]}", n))
shape("x [true,…]", "x of booleans")(lambda n: fill(b'{"x": [', same(b"true"), b"]}", n))
shape("x [NaN,…]", "x of NaN (not JSON: orjson refuses it, the model reports non_finite)")(
    lambda n: fill(b'{"x": [', same(b"NaN"), b"]}", n)
)
shape("x [1e999,…]", "x of numbers that overflow to infinity")(lambda n: fill(b'{"x": [', same(b"1e999"), b"]}", n))
shape("x [0,…]", "x of 0s (more than max_features from 200 KB)")(lambda n: fill(b'{"x": [', same(b"0"), b"]}", n))
shape('x [[],…] + "é\\u0000"', "x of empty lists and strings with escapes")(
    lambda n: fill(b'{"x": [', lambda i: b"[]" if i % 2 else b'"\\u00e9\\u0000"', b"]}", n)
)
shape('features {"k": [],…}', "features of empty lists")(
    lambda n: fill(b'{"features": {', lambda i: b'"%d": []' % i, b"}}", n)
)
shape('features {"k": {},…}', "features of empty objects")(
    lambda n: fill(b'{"features": {', lambda i: b'"%d": {}' % i, b"}}", n)
)
shape('features {"k": null,…}', "features of nulls")(
    lambda n: fill(b'{"features": {', lambda i: b'"%d": null' % i, b"}}", n)
)
shape('features {"k": "a",…}', "features of strings")(
    lambda n: fill(b'{"features": {', lambda i: b'"%d": "a"' % i, b"}}", n)
)
shape('features {"k": NaN,…}', "features of NaN")(
    lambda n: fill(b'{"features": {', lambda i: b'"%d": NaN' % i, b"}}", n)
)
shape('features {"a": [],…} dup', "features of one key repeated, empty lists")(
    lambda n: fill(b'{"features": {', same(b'"a": []'), b"}}", n)
)
shape('features {"\\u…": [],…}', "features of empty lists under escaped keys")(
    lambda n: fill(b'{"features": {', lambda i: b'"\\u00e9%d": []' % i, b"}}", n)
)
shape("x and features bad", "both forms, both full of bad values")(
    lambda n: (
        fill(b'{"x": [', same(b"[]"), b"]", n // 2)
        + fill(b', "features": {', lambda i: b'"%d": []' % i, b"}}", n - n // 2)
    )
)
shape("id [[],…]", "an id that is a list of lists")(lambda n: fill(b'{"x": [1.0], "id": [', same(b"[]"), b"]}", n))
shape('y {"k": [],…}', "a label that is an object of lists")(
    lambda n: fill(b'{"x": [1.0], "y": {', lambda i: b'"%d": []' % i, b"}}", n)
)
shape("many extra keys", "a valid x and many keys of the producer's own")(
    lambda n: fill(b'{"x": [1.0], ', lambda i: b'"k%d": 0' % i, b"}", n)
)
shape("many extra [] keys", "a valid x and many keys of the producer's own holding lists")(
    lambda n: fill(b'{"x": [1.0], ', lambda i: b'"k%d": []' % i, b"}", n)
)
shape("extra key deep", "a valid x and a key holding lists nested 150 deep, repeated")(
    lambda n: fill(b'{"x": [1.0], "e": [', same(b"[" * 150 + b"]" * 150), b"]}", n)
)
shape("root [[],…]", "a list of lists instead of an object")(lambda n: fill(b"[", same(b"[]"), b"]", n))
shape("deep nesting", "lists nested as deep as the message allows")(lambda n: b'{"x": ' + b"[" * (n - 8) + b"}")
# Found only at the end: everything before is parsed first.
shape("[[],…] then cut", "x of empty lists, cut short (invalid JSON at the end)")(
    lambda n: fill(b'{"x": [', same(b"[]"), b",", n)
)
shape("[[],…] then \\xff", "x of empty lists, then a byte that is not UTF-8")(
    lambda n: fill(b'{"x": [', same(b"[]"), b',"\xff"]}', n)
)
shape("[[],…] then \\ud800", "x of empty lists, then a lone surrogate")(
    lambda n: fill(b'{"x": [', same(b"[]"), b',"\\ud800"]}', n)
)
shape("floats then NaN", "a valid-looking x whose last value is NaN")(
    lambda n: fill(b'{"x": [', lambda i: b"0.%017d" % (12345678901234567 + i * 7919), b",NaN]}", n)
)
shape("floats then []", "a valid-looking x whose last value is a list")(
    lambda n: fill(b'{"x": [', lambda i: b"0.%017d" % (12345678901234567 + i * 7919), b",[]]}", n)
)
# One big value.
shape("long id string", "one long id")(lambda n: b'{"x": [1.0], "id": "' + b"a" * (n - 25) + b'"}')
shape('x ["aaa…"]', "x holding one long string (quoted in the error)")(lambda n: b'{"x": ["' + b"a" * (n - 12) + b'"]}')
shape('x ["\\u0000…"]', "x holding one long string of escapes")(
    lambda n: b'{"x": ["' + b"\\u0000" * ((n - 12) // 6) + b'"]}'
)
shape("long key", "features with one long name and a bad value (quoted in the error)")(
    lambda n: b'{"features": {"' + b"k" * (n - 25) + b'": "a"}}'
)
shape("not UTF-8", "random-looking bytes")(lambda n: bytes((i * 131 + 7) % 256 for i in range(n)))
shape("UTF-16", "a valid event, written in UTF-16")(lambda n: _valid_x(n // 2).decode().encode("utf-16"))


def best_cost(call: Callable[[], object], rounds: int, min_batch_s: float = 0.005) -> float:
    """Seconds per call: the best of ``rounds`` batches, each long enough to time."""
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    batch = max(1, int(min_batch_s / once))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batch):
            call()
        best = min(best, (time.perf_counter() - start) / batch)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="message sizes in bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=7, help="timed batches per message (the best counts)")
    parser.add_argument("--max-features", type=int, default=100_000)
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree whose decoder is measured")
    parser.add_argument("--only", default="", help="shapes whose name contains this text (and the reference)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    try:
        from perceptron_stream.wire.inputs import Decoder
    except ImportError:  # a tree from before service/wire/ (0.1: service/schema.py)
        from perceptron_stream.schema import Decoder  # type: ignore[import-not-found, no-redef]  # that tree's module

    sizes = [int(s) for s in args.sizes.split(",")]
    names = [name for name in SHAPES if name == "valid x" or args.only in name]
    messages = {(name, size): SHAPES[name][1](size) for name in names for size in sizes}
    gc.collect()
    gc.freeze()  # as the service does after start-up

    rows = []
    for size in sizes:
        reference = None
        for name in names:
            raw = messages[(name, size)]
            decoder = Decoder(max_message_bytes=1_048_576, max_features=args.max_features)
            outcome = decoder.decode(raw)
            cost = best_cost(functools.partial(decoder.decode, raw), args.rounds)
            per_byte = cost / len(raw) * 1e9
            if name == "valid x":
                reference = per_byte
            kind = getattr(outcome, "reason", type(outcome).__name__)  # a rejection's reason, or Event (any tree's)
            assert reference is not None  # valid x is measured first
            rows.append(
                {
                    "size": size,
                    "shape": name,
                    "bytes": len(raw),
                    "outcome": kind,
                    "us": cost * 1e6,
                    "ns_per_byte": per_byte,
                    "x_valid": per_byte / reference,
                }
            )

    print(f"# {platform.python_version()}, {platform.machine()}, tree {args.tree}, max_features {args.max_features}")
    header = (
        f"| {'size':>9} | {'shape':<28} | {'bytes':>9} | {'outcome':<17} | {'µs':>9} | {'ns/B':>7} | {'× valid':>8} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for size in sizes:
        group = [r for r in rows if r["size"] == size]
        worst = max((r for r in group if r["shape"] != "valid x"), key=lambda r: r["x_valid"], default=None)
        for r in group:
            mark = " ◀" if r is worst else ""
            print(
                f"| {r['size']:>9,} | {r['shape']:<28} | {r['bytes']:>9,} | {r['outcome']:<17} | {r['us']:>9,.1f} | "
                f"{r['ns_per_byte']:>7.1f} | {r['x_valid']:>7.1f}×{mark} |"
            )
    for size in sizes:
        group = [r for r in rows if r["size"] == size and r["shape"] != "valid x"]
        if group:
            worst = max(group, key=lambda r: r["x_valid"])
            print(
                f"worst at {size:,} bytes: {worst['shape']} {worst['ns_per_byte']:.1f} ns/B = {worst['x_valid']:.1f}× valid"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
