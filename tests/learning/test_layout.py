"""The learning core stays free of Kafka, HTTP and pickle (docs: reference/layout.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LEARNING = Path(__file__).resolve().parents[2] / "service" / "learning"
FORBIDDEN = {
    "kafka",
    "confluent_kafka",
    "http",
    "urllib",
    "urllib3",
    "requests",
    "aiohttp",
    "socket",
    "prometheus_client",
    "pickle",
    "cloudpickle",
    "dill",
    "joblib",
    "shelve",
    "marshal",
}


def _modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _modules(path)}


@pytest.mark.parametrize("path", sorted(LEARNING.rglob("*.py")), ids=lambda p: str(p.relative_to(LEARNING)))
def test_no_kafka_http_or_pickle_imports(path):
    assert not _imports(path) & FORBIDDEN
    assert _imports(path) <= {
        "__future__",
        "collections",
        "itertools",
        "math",
        "numbers",
        "operator",
        "random",
        "sys",
        "typing",
        "numpy",  # the batch form of step (learning/many.py); river depends on it too
        "river",
        "perceptron_stream",
    }
    own = {name for name in _modules(path) if name.split(".")[0] == "perceptron_stream"}
    assert all(name.startswith("perceptron_stream.learning") for name in own), own  # the core imports only itself
