"""kafka-python laid out otherwise than the mends of its bugs were checked against (service/kafka/kp_mends.py).

Upstream's master moves ``kafka.net.selector`` (dpkp/kafka-python#3127): ``import perceptron_stream`` must still
work, and a command that would build a kafka-python client must refuse to start, naming the mend, what it lacks
and the versions checked, with exit 1 (an error retrying cannot cure, docs/reference/cli.md) — not an ImportError
at import, nor a service that runs without its mends. The moved module is made unimportable in a fresh
interpreter after kafka-python's own import (``sys.modules[name] = None``), as a kafka-python that no longer has it
would be to the service.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kafka.consumer.fetcher import Fetcher
from perceptron_stream.broker import free_port
from perceptron_stream.kafka import KafkaFatal, kp_mends

#: kafka-python imported whole first (its own modules need the one moved away), then the module made unimportable.
SELECTOR_MOVED = "import sys, kafka; sys.modules['kafka.net.selector'] = None\n"
REFUSAL = (
    "net_client (a SASL rejection or an unverified certificate is final) needs kafka.net.selector.NetworkSelector",
    "checked against kafka-python 3.0.0 to 3.0.12 only",
    "pip install 'kafka-python>=3.0,<3.1'",
)


def python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=180, cwd=cwd, check=False
    )


def test_the_package_imports_with_a_mends_module_moved(tmp_path):
    done = python(
        SELECTOR_MOVED + "import perceptron_stream.app, perceptron_stream.kafka, perceptron_stream.cli as cli\n"
        "import json; from perceptron_stream.kafka import kp_mends\n"
        "print(json.dumps(sorted(kp_mends.missing_targets())))\n"
        "sys.exit(cli.main(['--version']))",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    missing, version = done.stdout.splitlines()
    assert version == "perceptron-stream 0.1.0"
    # the selector's mend, and the close race's filter of the selector's logger; nothing else
    assert json.loads(missing) == [
        "_CloseRaceFilter (the close race's ERROR lines quieted)",
        "net_client (a SASL rejection or an unverified certificate is final)",
    ]


@pytest.mark.parametrize("command", ["serve", "produce"])
def test_a_command_that_builds_a_kafka_python_client_refuses_to_start_naming_the_mend(tmp_path, command):
    """Refused before any connection: the brokers' address is a closed port, which would otherwise be retried."""
    args = ["--bootstrap-servers", f"127.0.0.1:{free_port()}"]
    if command == "serve":
        args += ["--metrics-port", "0", "--state-dir", str(tmp_path / "state")]
    else:
        args += ["--count", "1"]
    done = python(
        SELECTOR_MOVED + "import perceptron_stream.cli as cli; sys.exit(cli.main(sys.argv[1:]))",
        command,
        *args,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"perceptron-stream {command}: "), done.stderr
    for part in REFUSAL:
        assert part in last, done.stderr
    assert "Traceback" not in done.stderr


def test_every_target_is_in_the_installed_kafka_python():
    """The versions the tests run with are among those checked: every mend applies (a lock moved to a kafka-python
    that lacks one fails here first)."""
    assert kp_mends.missing_targets() == {}
    kp_mends.require_mends()


def test_a_patched_method_gone_names_its_mends(monkeypatch):
    monkeypatch.delattr(Fetcher, "fetched_records")
    missing = kp_mends.missing_targets()
    assert sorted(missing) == [
        "_failed_batches_are_fetched_again (a batch that failed to parse does not spin every poll)",
        "_resumed_partitions_fetch_again (a resumed partition is fetched again)",
    ]
    for problems in missing.values():
        assert problems == ["kafka.consumer.fetcher.Fetcher.fetched_records (Fetcher has no fetched_records)"]
    message = str(kp_mends.mend_missing(missing))
    assert "_resumed_partitions_fetch_again (a resumed partition is fetched again) needs kafka.consumer" in message
    assert "checked against kafka-python 3.0.0 to 3.0.12 only" in message


def test_an_instance_attribute_gone_names_its_mend_too():
    """A target set in ``__init__`` is found in the class's code; a client built without it is refused as well."""

    class Laidout:  # a consumer of a kafka-python whose fetcher keeps no line of records
        _fetcher = object()
        _coordinator = object()

    assert kp_mends.Target("kafka.consumer.fetcher", "Fetcher", "_paused_partition_records").problem() is None
    with pytest.raises(KafkaFatal) as refused:
        kp_mends.mend_consumer(Laidout())
    assert "_resumed_partitions_fetch_again (a resumed partition is fetched again) needs " in str(refused.value)
    assert "Laidout._fetcher.fetched_records, Laidout._fetcher._next_partition_records" in str(refused.value)
    assert (
        refused.value.hint == "install a kafka-python they were checked against: pip install 'kafka-python>=3.0,<3.1'"
    )


def test_the_transactional_cost_mend_is_left_out_with_a_warning(caplog):
    """The one mend that is a cost, not a bug: sends take kafka-python's locks as before, and the log says so."""

    class Laidout:
        _transaction_manager = None

    producer = Laidout()
    with caplog.at_level("WARNING", logger="perceptron_stream.kafka.kp_mends"):
        kp_mends.mend_transactional_producer(producer)
    assert "mend_transactional_producer" in caplog.text
    assert "3.0.0 to 3.0.12" in caplog.text
