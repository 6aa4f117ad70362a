"""The cost of one mixing round in the learning core: mix 4 partitions' states, rebuild the learner, encode the record.

python3 bench/mixing_cost.py
"""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from perceptron_stream.learning import learner_from_state, make_learner
from perceptron_stream.learning.mixing import mix_states
from perceptron_stream.state.checkpoint import Checkpoint, Owner, encode_checkpoint

rng = random.Random(1)
for d in (10, 1000, 50000):
    states = []
    for _ in range(4):
        m = make_learner(max_features=None)
        names = [f"feature-{i:06d}" for i in range(d)]
        for _ in range(3):
            m.step({n: rng.uniform(-1, 1) for n in names}, rng.choice((1, -1)))
        states.append(m.to_state())
    owner = Owner("g", "points", "partition-0")
    reps = 20 if d <= 1000 else 3
    t = time.perf_counter()
    for _ in range(reps):
        mixed = learner_from_state(mix_states(states[0], states, [0.25] * 4))
        encode_checkpoint(
            Checkpoint(
                seq=1,
                positions={("points", 0): 1},
                model=states[0],
                owner=owner,
                task={"mix": {"mistakes": 3, "learned": 1000, "inputs": []}},
            )
        )
    round_ms = (time.perf_counter() - t) / reps * 1000
    print(f"d = {d:>6,}: {round_ms:8.2f} ms a round, {round_ms * 1000 / 1000:7.2f} µs an event at --mix-every 1000")
