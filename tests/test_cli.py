"""The command line: train over files, produce into the embedded broker, broker in the foreground."""

import json
import signal
import subprocess
import sys

import pytest

from service.cli import main
from tests.conftest import ROOT, consume, wait_until

SEED_003 = "x1,x2,y\n1,2,1\n2,4,1\n3,4,1\n2,1,-1\n4,2,-1\n"


def test_train_reproduces_seed_003_from_csv(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text(SEED_003)
    assert main(["train", "--data", str(data)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["weights"], report["bias"], report["updates"], report["converged"]) == ([-1.0, 1.0], 0.0, 2, True)
    assert report["training_mistakes"] == 0 and report["margin"] > 0
    assert report["bound"] == pytest.approx((report["radius"] / report["margin"]) ** 2)


def test_train_reads_the_wire_format_and_pocket_on_non_separable_data(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    # the offset example of seed 002, plus one flipped label: not separable any more
    rows = [{"x": [1.0], "y": 1}, {"x": [2.0], "y": 1}, {"x": [3.0], "y": -1}, {"x": [4.0], "y": -1}, {"x": [1.5], "y": -1}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["train", "--data", str(data), "--algorithm", "pocket", "--order", "random", "--seed", "3", "--max-passes", "50"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["converged"] is False and report["bound"] is None
    assert report["training_mistakes"] == 1  # the best a line can do here
    assert report["margin"] < 0


def test_train_names_a_bad_data_file(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"x": [1.0]}\n')
    assert main(["train", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "invalid setting data (--data)" in err and "has no label" in err


@pytest.mark.integration
def test_produce_writes_a_seeded_stream_and_replays_files(broker, topics, tmp_path):
    topic = topics["input_topic"]
    args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--no-progress"]
    assert main(["produce", *args, "--stream", "credit", "--count", "300", "--seed", "7"]) == 0
    data = tmp_path / "d.csv"
    data.write_text(SEED_003)
    assert main(["produce", *args, "--file", str(data)]) == 0
    records = consume(broker.bootstrap_servers, topic, 305)
    events = [json.loads(r.value) for r in records]
    assert [e["id"] for e in events[:3]] == ["app-0", "app-1", "app-2"]
    assert set(events[0]["features"]) == {"age", "salary", "years_in_job", "debt"}
    assert records[0].key == b"app-0"
    assert events[300:] == [{"features": {"x1": 1.0, "x2": 2.0}, "y": 1}, {"features": {"x1": 2.0, "x2": 4.0}, "y": 1},
                            {"features": {"x1": 3.0, "x2": 4.0}, "y": 1}, {"features": {"x1": 2.0, "x2": 1.0}, "y": -1},
                            {"features": {"x1": 4.0, "x2": 2.0}, "y": -1}]


def test_broker_command_serves_until_sigterm(tmp_path):
    from service.broker import free_port

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "broker", "--port", str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        first = process.stdout.readline()
        assert f"127.0.0.1:{port}" in first
        from kafka import KafkaAdminClient

        admin = wait_until(lambda: _admin(port), 20, what="the broker to answer")
        admin.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()


def _admin(port):
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        return KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", bootstrap_timeout_ms=2000)
    except KafkaError:
        return None
