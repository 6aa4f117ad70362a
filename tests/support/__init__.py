"""Helpers the tests share (fixtures stay in the conftest.py files): brokers, certificates, topics, the service's runs.

A test module imports what it needs from here, never from another test module
nor from a conftest.py; :data:`ROOT` is the repository's root.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

#: Five points in two dimensions, separable with the bias: what `train` learns and `produce --file` replays.
SEED_003 = "x1,x2,y\n1,2,1\n2,4,1\n3,4,1\n2,1,-1\n4,2,-1\n"
