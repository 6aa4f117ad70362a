"""The docs' Python examples that need a broker (marked ``docs-test: skip`` for the unit run), run against one.

Each sends its events with kafka-python to ``127.0.0.1:9092``, topics ``points`` (and ``labels``): here the test
broker and topics of the test's own, with a service reading them as the page says (``serve``, with
``--label-topic`` where the example sends labels). Every point an example sends must come out as a prediction.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.docs import DOCS, commands_of, python_examples, shell_examples, write_config_files
from tests.support.endpoints import http_get
from tests.support.launch import settings_args
from tests.support.prometheus_server import free_port
from tests.support.service import source_partition_offset, stop_process, tail
from tests.support.topics import consume, create_topic, read_all
from tests.support.waiting import wait_until

NEED_A_BROKER = [example for example in python_examples() if example.skipped]


def test_there_are_examples_that_need_a_broker():
    assert len(NEED_A_BROKER) >= 2, [example.name for example in NEED_A_BROKER]


@pytest.mark.parametrize("example", NEED_A_BROKER, ids=lambda e: e.name)
def test_the_example_works_against_a_broker(example, broker, topics, tmp_path, service_thread):
    names = {**topics, "input_topic": f"points-{topics['group_id']}"}
    code = example.code.replace("127.0.0.1:9092", broker.bootstrap_servers).replace(
        '"points"', repr(names["input_topic"])
    )
    if '"labels"' in code:
        names["label_topic"] = f"labels-{topics['group_id']}"
        names["outcome_topic"] = f"outcomes-{topics['group_id']}"
        code = code.replace('"labels"', repr(names["label_topic"]))
        create_topic(broker.bootstrap_servers, names["label_topic"])
    create_topic(broker.bootstrap_servers, names["input_topic"])
    sent = re.findall(r"send\(\s*" + re.escape(repr(names["input_topic"])) + r".*?value=b\'(\{.*?\})\'", code)
    ids = [json.loads(value)["id"] for value in sent]
    assert ids, code
    service = service_thread(settings_args(broker, names, tmp_path))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 200, 60, what="ready")
    exec(compile(code, example.name, "exec"), {})
    predictions = [json.loads(m.value) for m in consume(broker.bootstrap_servers, names["output_topic"], len(ids))]
    assert [p["id"] for p in predictions] == ids
    if "label_topic" in names:
        [outcome] = consume(broker.bootstrap_servers, names["outcome_topic"], 1)
        assert json.loads(outcome.value)["id"] == ids[0]
    service.stop()


def test_the_scale_out_commands_run_as_written_on_one_host(broker, tmp_path):
    """docs/concepts/scopes.md's instances on one host, as the page writes them, in its order: two `serve` with the
    settings file it shows and ports of their own, then `produce`, then its `curl`s (read here with urllib). The
    page's names and ports made the test's own (the broker is shared); what the page says then holds: each instance
    serves 2 of the 4 partitions, every event is predicted, and once one stops the other serves all 4."""
    tag = uuid.uuid4().hex[:8]
    ports = {"8001": str(free_port()), "8002": str(free_port())}
    text = (DOCS / "concepts" / "scopes.md").read_text(encoding="utf-8").replace("orders", f"orders-{tag}")
    for page_port, port in ports.items():
        text = text.replace(page_port, port)
    page = tmp_path / "scopes.md"
    page.write_text(text, encoding="utf-8")
    assert write_config_files(page, tmp_path) == [f"orders-{tag}.toml"]
    [example] = [e for e in shell_examples([page]) if "--metrics-port" in e.code]
    env = {**os.environ, "PERCEPTRON_STREAM_BOOTSTRAP_SERVERS": broker.bootstrap_servers}
    instances: list[tuple[subprocess.Popen, Path]] = []
    metric_lines = []
    try:
        for line_env, command in commands_of(example):
            if command[0] == "curl":  # curl -s HOST:PORT/metrics | grep '^NAME'
                assert command[1] == "-s" and command[3:5] == ["|", "grep"] and len(command) == 6, command
                for _, log in instances:  # "once both have logged `assigned orders[...]`"
                    wait_until(lambda log=log: f"assigned orders-{tag}[" in log.read_text(), 120, what=str(log))
                url, pattern = "http://" + command[2], command[5]
                metric_lines.append(
                    wait_until(
                        lambda url=url, pattern=pattern: _grep(url, pattern) == ["perceptron_assigned_partitions 2.0"],
                        120,
                        what=f"{url}: 2 partitions",
                    )
                )
                continue
            assert command[0] == "perceptron-stream", command
            run = [sys.executable, "-m", "perceptron_stream.cli", *command[1:]]
            if command[1] == "serve":  # the lines ending in &
                log = tmp_path / f"serve-{len(instances) + 1}.log"
                with open(log, "ab") as out:
                    instances.append(
                        (
                            subprocess.Popen(
                                run, cwd=tmp_path, env={**env, **line_env}, stdout=out, stderr=subprocess.STDOUT
                            ),
                            log,
                        )
                    )
            else:
                done = subprocess.run(
                    run, cwd=tmp_path, env={**env, **line_env}, capture_output=True, text=True, timeout=300
                )
                assert done.returncode == 0, done.stderr[-3000:]
        assert len(instances) == 2 and len(metric_lines) == 2, (instances, metric_lines)
        predictions = f"orders-{tag}.predictions"

        def predicted() -> int:  # distinct inputs: a rebalance may repeat some (at least once)
            return len(
                {source_partition_offset(json.loads(m.value)) for m in read_all(broker.bootstrap_servers, predictions)}
            )

        wait_until(lambda: predicted() == 10_000, 180, what="10,000 predictions")
        (first, first_log), (_, second_log) = instances
        first.send_signal(signal.SIGTERM)  # kill %1
        assert first.wait(60) == 0, tail(first_log)
        url = f"http://localhost:{ports['8002']}/metrics"
        wait_until(
            lambda: _grep(url, "^perceptron_assigned_partitions") == ["perceptron_assigned_partitions 4.0"],
            120,
            what="all 4 on the other",
        )
        *_, last = re.findall(rf"assigned (orders-{tag}\[.*)", first_log.read_text())
        its = {f"partition-{p}" for p in re.findall(r"\[(\d+)\]", last)}
        assert len(its) == 2, last
        wait_until(  # the first one's two, from the checkpoint topic
            lambda: its <= set(re.findall(r"restored checkpoint \d+ of (partition-\d+)", second_log.read_text())),
            120,
            what=f"{sorted(its)} restored",
        )
        for _, log in instances:
            assert "Traceback" not in log.read_text(), tail(log)
    finally:
        for process, log in instances:
            stop_process(process, log)


def _grep(url: str, pattern: str) -> list[str]:
    """``curl -s URL | grep PATTERN``: the lines of the page at ``url`` that match."""
    return [line for line in http_get(url)[1].splitlines() if re.match(pattern, line)]
