"""The docs' commands and Python examples that need brokers, run against them.

Each Python example marked ``docs-test: skip`` (for the unit run) sends its events with kafka-python to
``127.0.0.1:9092``, on the topic of points it names (then the topic of labels, when it sends labels): here the test
broker and topics of the test's own, with a service reading them as the page says (``serve``, with
``--label-topic`` where the example sends labels). Every point an example sends must come out as a prediction.

The exactly-once page's commands and its ``read_committed`` reader run on Apache Kafka as written, but for the
names (made the test's own), the address and the metrics port (given in the environment), across a SIGKILL.

The runbooks' snippets (operations/runbooks/index.md: a topic's newest records, a consumer group, a topic) read a
running service's topics and group on Apache Kafka (exact end offsets), with the test's names and address.

Then the walk: README's and the pages' ```sh blocks, in order, on one machine (tests/support/docs.py's Machine), as a
newcomer copies them, each page getting what it says.
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
import uuid
from pathlib import Path

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.runtime.factory import policy_client_id

from tests.support import ROOT
from tests.support.docs import DOCS, ShellExample, commands_of, python_examples, shell_examples, write_config_files
from tests.support.endpoints import http_get
from tests.support.launch import settings_args, start_service_process
from tests.support.prometheus_server import free_port
from tests.support.service import make_events, source_partition_offset, stop_process, tail, wait_assigned
from tests.support.topics import consume, create_topic, end_offset, produce, read_all, stable_offsets
from tests.support.waiting import wait_until

NEED_A_BROKER = [example for example in python_examples() if example.skipped and "KafkaProducer" in example.code]
GUARANTEES = DOCS / "concepts" / "guarantees.md"
RUNBOOKS = DOCS / "operations" / "runbooks" / "index.md"


def test_there_are_examples_that_need_a_broker():
    assert len(NEED_A_BROKER) >= 2, [example.name for example in NEED_A_BROKER]


@pytest.mark.parametrize("example", NEED_A_BROKER, ids=lambda e: e.name)
def test_the_example_works_against_a_broker(example, broker, topics, tmp_path, service_thread):
    sent_to = list(dict.fromkeys(re.findall(r'send\(\s*"([^"]+)"', example.code)))  # the points' topic, then labels'
    names = {**topics, "input_topic": f"points-{topics['group_id']}"}
    code = example.code.replace("127.0.0.1:9092", broker.bootstrap_servers).replace(
        f'"{sent_to[0]}"', repr(names["input_topic"])
    )
    if len(sent_to) > 1:
        names["label_topic"] = f"labels-{topics['group_id']}"
        names["outcome_topic"] = f"outcomes-{topics['group_id']}"
        code = code.replace(f'"{sent_to[1]}"', repr(names["label_topic"]))
        create_topic(broker.bootstrap_servers, names["label_topic"])
    create_topic(broker.bootstrap_servers, names["input_topic"])
    sent = re.findall(r"b\'(\{.*?\})\'", code)
    points = [value for value in sent if "label_topic" not in names or '"y": ' not in value]  # labels carry y
    ids = [json.loads(value)["id"] for value in points]
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
    args = settings_args(apache_kafka, topics, tmp_path)
    service = service_thread(args)
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
    client = policy_client_id(load(ServeSettings, args))  # the member's client id says its model's policy
    assert f"  {client} on /127.0.0.1 holds {points}[0]" in described, described
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


# -- the pages' commands, in order, on one machine ----------------------------------------------------------------


def _page_python(page, containing: str) -> str:
    [example] = [e for e in python_examples() if e.page == page and containing in e.code]
    return example.code


def _records_since(bootstrap: str, topic: str, offset: int, until) -> list:
    """The records of ``topic`` (one partition) from ``offset`` on, read until ``until(records)`` holds."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, offset)
    records: list = []

    def read_more() -> bool:
        records.extend(consumer.poll(timeout_ms=500).get(tp, []))
        return until(records)

    try:
        wait_until(read_more, 120, what=f"records of {topic}")
    finally:
        consumer.close()
    return records


def test_the_pages_run_in_order_on_one_machine_as_written(tmp_path, monkeypatch):
    """A newcomer's walk, the commands copied as written, in order, on one machine (one home, so one state
    directory): README's tour and your own Kafka on an Apache Kafka of the test's own (``kafka:9092``, ``host:9092``:
    fresh, like a reader's, so the pages' default names meet nothing but each other), then the measurement on the
    embedded broker it starts, then warm start, delayed labels, challengers, a signed model and river's Phishing set
    on that broker, still running. Each page gets what it says: no page meets another's topics, groups or
    checkpoints."""
    from perceptron_stream.broker import free_port
    from perceptron_stream.config import ServeSettings, load

    from tests.support.brokers import new_broker
    from tests.support.docs import DOCS, README, Machine, block_of, commands_of, shell_examples
    from tests.support.endpoints import metric
    from tests.support.topics import end_offset

    ports = {page_port: free_port() for page_port in (8000, 8001, 8002)}
    machine = Machine(tmp_path / "home", default_port=free_port(), ports=ports)
    embedded = f"127.0.0.1:{machine.default_port}"
    own_kafka = DOCS / "getting-started" / "own-kafka.md"
    url = f"http://127.0.0.1:{ports[8000]}/metrics"
    ready = f"http://127.0.0.1:{ports[8000]}/readyz"

    def metrics() -> str:
        return http_get(url)[1]

    def labeled(text: str) -> float:
        return metric(text, 'perceptron_events_total{kind="labeled"}')

    with new_broker("apache-kafka", tmp_path / "kafka") as kafka:
        yours = {"kafka:9092": kafka.bootstrap_servers, "host:9092": kafka.bootstrap_servers}
        try:
            # README's tour: about one mistake in thirty events with the demo's settings, on the stream it sends
            machine.run(block_of(README, "kafka:9092"), yours)
            machine.wait_until(lambda: labeled(metrics()) >= 10_000, 300, what="10,000 events learned")
            text = metrics()
            rate = metric(text, "perceptron_mistakes_total") / labeled(text)
            print(f"README's tour: {metric(text, 'perceptron_mistakes_total'):.0f} mistakes in {labeled(text):.0f}")
            assert rate < 1 / 25, f"README's tour: a mistake on {rate:.3f} of the events, not one in thirty"
            machine.stop()

            # your own Kafka: the same model resumes; 100 unlabeled applications, then the Python snippet's event
            blocks = shell_examples([own_kafka])
            machine.run(blocks[0], yours)
            machine.wait_until(lambda: http_get(ready)[0] == 200, 120, what="the model ready")
            machine.run(blocks[1], yours)
            since = end_offset(kafka.bootstrap_servers, "predictions")
            exec(
                compile(
                    _page_python(own_kafka, "KafkaProducer").replace("127.0.0.1:9092", kafka.bootstrap_servers),
                    "own-kafka.md",
                    "exec",
                ),
                {},
            )
            _records_since(
                kafka.bootstrap_servers,
                "predictions",
                since,
                lambda records: any(json.loads(r.value)["id"] == "c-1042" for r in records),
            )
            assert metric(metrics(), "perceptron_events_without_known_features_total") == 0, "the snippet's event"
            machine.stop()

            # the measurement: on the embedded broker the block starts, which then keeps running
            [measure] = [block for block in blocks if "credit-20k" in block.code]
            *_, printed = machine.run(measure, timeout=900)
            machine.stop(keep=1)
            lines = printed.splitlines()
            assert [line for line in lines if line.startswith('perceptron_events_total{kind="labeled"}')] == [
                'perceptron_events_total{kind="labeled"} 20000.0'
            ] * 2, printed
            mistakes = [
                metric(line, "perceptron_mistakes_total")
                for line in lines
                if line.startswith("perceptron_mistakes_total ")
            ]
            assert [round(m / 20_000, 3) for m in mistakes] == [0.217, 0.037], printed  # the page's table
            for block in blocks[3:]:
                if "--variant averaged --standardize" in block.code and "credit-20k" not in block.code:
                    machine.run(block, yours)  # "for streams whose features differ in scale": the model of above
                    machine.wait_until(lambda: http_get(ready)[0] == 200, 120, what="the model ready")
                    machine.stop(keep=1)

            # warm start, on the embedded broker still running: the textbook's five points, predicted right
            [warm] = shell_examples([DOCS / "how-to" / "warm-start.md"])
            machine.run(warm)
            serve = next(args for _, args in commands_of(warm) if args[1:2] == ["serve"])
            monkeypatch.chdir(machine.home)  # where model.json is
            output = load(ServeSettings, serve[2:]).output_topic
            machine.wait_until(lambda: labeled(metrics()) >= 5, 120, what="the five points")
            predictions = [json.loads(m.value) for m in consume(embedded, output, 5, timeout=120)]
            assert [(p["y_pred"], p["mistake"]) for p in predictions] == [(1, False)] * 3 + [(-1, False)] * 2
            machine.check_running()
            machine.stop(keep=1)

            # delayed labels: the service, the snippet's decision and outcome, then 2,000 synthetic ones
            page = DOCS / "concepts" / "delayed-labels.md"
            start, send = shell_examples([page])
            machine.run(start)
            machine.wait_until(lambda: http_get(ready)[0] == 200, 120, what="ready")
            exec(
                compile(
                    _page_python(page, "KafkaProducer").replace("127.0.0.1:9092", embedded), "delayed-labels.md", "exec"
                ),
                {},
            )
            machine.run(send)
            joined = 'perceptron_labels_total{outcome="joined"}'
            machine.wait_until(lambda: metric(metrics(), joined) >= 2001, 240, what="2,001 labels joined")
            text = metrics()
            rejected = [line for line in text.splitlines() if line.startswith("perceptron_rejected_events_total{")]
            assert metric(text, joined) == 2001 and all(line.endswith(" 0.0") for line in rejected), text

            machine.stop(keep=1)

            # challengers, reason codes, and a signed model: each a model of other settings, in a group of its own
            for page in (
                DOCS / "how-to" / "challengers-and-drift.md",
                DOCS / "how-to" / "explain-a-decision.md",
                DOCS / "how-to" / "security.md",
            ):
                [block] = [
                    block
                    for block in shell_examples([page])
                    if "--config-file" not in block.code and "perceptron-stream serve" in block.code
                ]
                machine.run(block)
                machine.wait_until(lambda: http_get(ready)[0] == 200, 120, what=f"{page.name}'s model ready")
                machine.stop(keep=1)

            # river's Phishing set, written out as the river page does, then produced and served as it says
            river = DOCS / "how-to" / "river.md"
            monkeypatch.chdir(machine.home)
            exec(compile(_page_python(river, "phishing.jsonl"), "river.md", "exec"), {"__name__": "__docs__"})
            [phishing] = [block for block in shell_examples([river]) if "phishing" in block.code]
            machine.run(phishing)
            machine.wait_until(lambda: labeled(metrics()) >= 1250, 120, what="the Phishing set's 1,250 events")
            text = metrics()
            assert labeled(text) == 1250 and metric(text, "perceptron_events_without_known_features_total") == 0
            assert metric(text, "perceptron_mistakes_total") == 177, text  # the page's figure: river's 85.84%
            machine.stop(keep=1)
        finally:
            machine.stop()


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
