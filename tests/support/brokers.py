"""A broker of a test's own, of either kind, for tests that freeze or stop it or need a cluster alone.

The run's shared brokers are the conftest.py fixtures' (``apache_kafka``, ``broker``).
"""

from __future__ import annotations

from pathlib import Path

from perceptron_stream.broker import EmbeddedBroker

from tests.support.apache_kafka import ApacheKafka


def new_broker(kind: str, root: Path):
    """A broker of ``kind`` ("apache-kafka" or "embedded") of a test's own, files under ``root``; use it with ``with``."""
    root.mkdir(parents=True, exist_ok=True)
    if kind == "apache-kafka":
        return ApacheKafka(root / "apache-kafka", heap="256m", quick_start=True)
    return EmbeddedBroker(log_path=root / "tansu.log")
