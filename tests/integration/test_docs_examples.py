"""The docs' Python examples that need a broker (marked ``docs-test: skip`` for the unit run), run against one.

Each that sends events (a ``KafkaProducer``) sends them with kafka-python to ``127.0.0.1:9092``, topics ``points``
(and ``labels``): here the test broker and topics of the test's own, with a service reading them as the page says
(``serve``, with ``--label-topic`` where the example sends labels). Every point an example sends must come out as a
prediction.

The exactly-once page's commands and its ``read_committed`` reader run on Apache Kafka as written, but for the
names (made the test's own), the address and the metrics port (given in the environment), across a SIGKILL.

The runbooks' snippets (operations/runbooks/index.md: a topic's newest records, a consumer group, a topic) read a
running service's topics and group on Apache Kafka (exact end offsets), with the test's names and address.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from perceptron_stream.config import ServeSettings, load

from tests.support import ROOT
from tests.support.docs import DOCS, ShellExample, commands_of, python_examples, shell_examples
from tests.support.endpoints import http_get
from tests.support.launch import settings_args, start_service_process
from tests.support.service import make_events, stop_process, tail, wait_assigned
from tests.support.topics import consume, create_topic, end_offset, produce, read_all, stable_offsets
from tests.support.waiting import wait_until

NEED_A_BROKER = [example for example in python_examples() if example.skipped and "KafkaProducer" in example.code]
GUARANTEES = DOCS / "concepts" / "guarantees.md"
RUNBOOKS = DOCS / "operations" / "runbooks" / "index.md"


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


# -- exactly-once, command by command (concepts/guarantees.md) ---------------------------------------------------


def _own_names(text: str, tag: str) -> str:
    """The page's topic and group names made this test's own (``points-eo.dlq`` follows ``points-eo``)."""
    for name in ("perceptron-eo", "predictions-eo", "points-eo"):
        text = text.replace(name, f"{name}-{tag}")
    return text


def test_the_exactly_once_commands_and_reader_see_each_input_once_across_a_kill(apache_kafka, topics, tmp_path):
    tag = topics["group_id"]
    blocks = [b for b in shell_examples([GUARANTEES]) if "-eo" in b.code]
    [[(serve_env, serve)], [(produce_env, produce)]] = [
        commands_of(ShellExample(b.page, b.line, _own_names(b.code, tag))) for b in blocks
    ]
    assert serve[:2] == ["perceptron-stream", "serve"] and produce[:2] == ["perceptron-stream", "produce"]
    assert not serve_env and not produce_env
    [reader] = [e for e in python_examples() if e.page == GUARANTEES and "read_committed" in e.code]
    assert reader.skipped  # the unit run leaves it to this test
    bootstrap = apache_kafka.bootstrap_servers
    env = {"PERCEPTRON_STREAM_BOOTSTRAP_SERVERS": bootstrap}
    serve_at = {**env, "PERCEPTRON_STREAM_METRICS_PORT": "0"}  # the page's 8000 is another worker's too
    settings = load(ServeSettings, [*serve[2:], "--bootstrap-servers", bootstrap])
    count = int(produce[produce.index("--count") + 1])
    points, predictions = settings.input_topic, settings.output_topic
    assert produce[produce.index("--topic") + 1] == points

    log = tmp_path / "serve.log"
    service = start_service_process(serve[2:], log, env=serve_at)
    producer = subprocess.Popen(
        [sys.executable, "-m", "perceptron_stream.cli", *produce[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    try:
        wait_assigned(service, log, points)
        wait_until(lambda: end_offset(bootstrap, predictions, read_committed=True) >= 1000, 120, what="1000 outputs")

        def frozen_in_a_transaction() -> bool:
            """The service stopped (SIGSTOP) while its open transaction holds outputs, else let go on."""
            service.send_signal(signal.SIGSTOP)
            held = end_offset(bootstrap, predictions) > end_offset(bootstrap, predictions, read_committed=True)
            if not held:
                service.send_signal(signal.SIGCONT)
            return held

        wait_until(frozen_in_a_transaction, 60, interval=0.01, what="outputs in an open transaction")
        service.kill()  # kill -9: its open transaction's outputs stay in the log, aborted
        service.wait()
        service = start_service_process(serve[2:], log, env=serve_at)  # the same command again
        assert producer.wait(120) == 0, producer.communicate()[0]
        wait_until(
            lambda: stable_offsets(settings, settings.group_id, points) == {0: count} or service.poll() is not None,
            180,
            what=f"all {count} points committed",
        )
        assert service.poll() is None, tail(log)
    finally:
        if producer.poll() is None:
            producer.kill()
        code = stop_process(service, log)
    assert code == 0, tail(log)
    wait_until(  # nothing open: a read_committed reader can read to the end
        lambda: end_offset(bootstrap, predictions, read_committed=True) == end_offset(bootstrap, predictions),
        60,
        what="no open transaction on the predictions",
    )

    namespace: dict = {}
    code_as_written = reader.code.replace("127.0.0.1:9092", bootstrap)
    exec(compile(_own_names(code_as_written, tag), reader.name, "exec"), namespace)
    assert namespace["repeats"] == 0
    assert namespace["inputs"] == {(points, 0, offset) for offset in range(count)}
    # not vacuous: the log holds copies that only read_committed leaves out
    assert len(read_all(bootstrap, predictions)) > count


# -- the runbooks' snippets (operations/runbooks/index.md) -------------------------------------------------------


def _run_snippet(title: str, replacements: dict[str, str]) -> str:
    """What the runbooks' snippet under ``### <title>`` prints, with the page's names replaced (each must occur)."""
    text = RUNBOOKS.read_text(encoding="utf-8")
    start = text.index(f"\n### {title}\n")
    [example] = [e for e in python_examples() if e.page == RUNBOOKS and text.index(e.code) > start][:1]
    code = example.code
    for old, new in replacements.items():
        assert old in code, (example.name, old)
        code = code.replace(old, new)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, example.name, "exec"), {})
    return out.getvalue()


def test_the_runbooks_snippets_read_a_running_service_s_topics_and_group(
    apache_kafka, topics, tmp_path, service_thread
):
    bootstrap = apache_kafka.bootstrap_servers
    points, dlq, group = topics["input_topic"], topics["dlq_topic"], topics["group_id"]
    events = make_events(200, seed=3)
    produce(
        bootstrap,
        points,
        [*events, *(b"not json %d" % i for i in range(7))],
        keys=[*(e["id"].encode() for e in events), *([None] * 7)],
    )
    service = service_thread(settings_args(apache_kafka, topics, tmp_path))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 200, 60, what="ready")  # its topics made
    wait_until(lambda: end_offset(bootstrap, dlq) == 7, 120, what="7 dead letters")
    address = {"127.0.0.1:9092": bootstrap}

    newest = _run_snippet("The newest records of a topic", {**address, '"points.dlq"': repr(dlq)})
    lines = newest.splitlines()
    assert [line.split(" key ")[0] for line in lines] == [f"{dlq}[0] offset {o}" for o in range(2, 7)], newest
    assert all(json.loads(line.split(": ", 1)[1])["reason"] == "invalid_json" for line in lines), newest

    found = _run_snippet(
        "The newest records of a topic", {**address, '"points.dlq", 5, ""': f'{points!r}, 1000, "p-17"'}
    )
    [line] = found.splitlines()  # p-17 alone, not p-170 to p-179
    assert line.startswith(f"{points}[0] offset 17 key p-17: ") and json.loads(line.split(": ", 1)[1])["id"] == "p-17"

    group_snippet = {**address, '"perceptron-stream"': repr(group)}
    described = _run_snippet("A consumer group: its members, their partitions, its lag", group_snippet)
    assert f"group {group}: Stable" in described, described
    assert f"  perceptron-stream on /127.0.0.1 holds {points}[0]" in described, described
    service.stop()  # a clean stop checkpoints, and commits the offsets with it
    described = _run_snippet("A consumer group: its members, their partitions, its lag", group_snippet)
    assert f"  {points}[0] committed 207 end 207 lag 0" in described, described

    topic = _run_snippet("A topic: does it exist, its partitions, its settings", {**address, '"points"': repr(points)})
    assert topic.splitlines()[0] == f"{points}: 1 partition(s)", topic
    assert "  max.message.bytes = " in topic and "  cleanup.policy = delete " in topic, topic
    missing = _run_snippet(
        "A topic: does it exist, its partitions, its settings", {**address, '"points"': repr(f"{points}-none")}
    )
    assert missing.startswith(f"{points}-none: no such topic"), missing
