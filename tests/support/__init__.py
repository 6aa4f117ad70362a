"""Helpers the tests share (fixtures stay in the conftest.py files): brokers, certificates, topics, the service's runs.

A test module imports what it needs from here, never from another test module
nor from a conftest.py; :data:`ROOT` is the repository's root.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
