"""``--processing-guarantee exactly-once`` with real processes: what a read_committed reader sees after a SIGKILL,
and the combinations start-up refuses (docs: concepts/guarantees.md).

On Apache Kafka, both clients: the service SIGKILLed mid-stream twice and run to the end; a read_committed
reader of the predictions sees every input offset exactly once, each prediction the uninterrupted run's, and
the last committed checkpoint holds the uninterrupted run's model. The embedded broker is refused (its
read_committed readers see aborted records: tests/integration/test_transactions.py). A zombie (an instance frozen
past its session timeout while another took its partition) publishes nothing once it thaws, and stops naming the
fencing.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import CompactedTopic, committed_offsets
from perceptron_stream.state.kafka_store import KafkaStore

from tests.support.launch import settings_args, start_service_process
from tests.support.service import (
    OutputWatcher,
    check_outputs,
    exit_code,
    has_traceback,
    make_events,
    offline,
    stop_process,
    store_args,
    tail,
    wait_assigned,
)
from tests.support.topics import produce
from tests.support.waiting import wait_until

EXACTLY_ONCE = {"processing_guarantee": "exactly-once", "commit_interval_ms": 100}


def _committed_checkpoint(args: list[str]):
    """The checkpoint committed with the group's offsets (the topic's reader also sees aborted records)."""
    s = load(ServeSettings, args)
    offsets = committed_offsets(s, s.group_id, s.input_topic)
    store = KafkaStore(CompactedTopic(s, s.checkpoint_topic), s.group_id)
    try:
        return store.load("model", committed={(s.input_topic, p): o for p, o in offsets.items()})
    finally:
        store.close()


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_sigkill_mid_stream_leaves_each_offset_predicted_exactly_once_for_read_committed_readers(
    client, apache_kafka, topics, tmp_path
):
    count = 6000
    events = make_events(count, seed=31)
    keys = [e["id"].encode() for e in events]
    expected, model = offline(events)
    produce(apache_kafka.bootstrap_servers, topics["input_topic"], events, keys=keys)
    args = settings_args(
        apache_kafka,
        topics,
        tmp_path,
        batch_size=100,
        kafka_client=client,
        **EXACTLY_ONCE,
        **store_args("kafka", topics),
    )
    watcher = OutputWatcher(apache_kafka.bootstrap_servers, topics["output_topic"], read_committed=True).start()
    process = None
    try:
        for run, kill_at in enumerate((count // 5, count // 2)):
            log_path = tmp_path / f"serve-{run}.log"
            process = start_service_process(args, log_path)
            wait_until(
                lambda kill_at=kill_at, process=process: watcher.distinct() >= kill_at or process.poll() is not None,
                180,
                interval=0.005,
                what=f"run {run}: {kill_at} offsets predicted",
            )
            assert process.poll() is None, f"run {run} exited with {process.returncode}:\n{tail(log_path)}"
            process.kill()  # with a transaction open: its outputs sent, some of them flushed to the log
            process.wait()
        log_path = tmp_path / "serve-final.log"
        process = start_service_process(args, log_path)
        wait_assigned(process, log_path, topics["input_topic"])
        wait_until(
            lambda: watcher.distinct() >= count or process.poll() is not None, 180, what="every offset predicted"
        )
        assert stop_process(process, log_path) == 0, tail(log_path)
        watcher.settle()
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        by_source = watcher.stop()

    for path in sorted(tmp_path.glob("serve-*.log")):
        assert not has_traceback(path.read_text(errors="replace")), f"{path.name}:\n{tail(path)}"
    repeats = check_outputs(by_source, expected, input_topic=topics["input_topic"], keys=watcher.keys, input_keys=keys)
    assert repeats == 0, f"{repeats} predictions seen twice by a read_committed reader"
    checkpoint = _committed_checkpoint(args)
    assert checkpoint.positions == {(topics["input_topic"], 0): count}
    assert checkpoint.model == model  # the exact state of an uninterrupted run


def _trickle(bootstrap: str, topic: str, events: list[dict], per_chunk: int = 1000, every_s: float = 0.5) -> None:
    """``events`` written ``per_chunk`` every ``every_s``: a stream that keeps coming."""
    for start in range(0, len(events), per_chunk):
        produce(bootstrap, topic, events[start : start + per_chunk])
        time.sleep(every_s)


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_zombie_whose_partition_moved_publishes_nothing_and_stops_naming_the_fencing(
    client, apache_kafka, topics, tmp_path
):
    """Partition scope: A processes, is frozen (SIGSTOP) with a transaction open, B takes its partition once A's
    session (6 s) is over and runs to the end; A thaws (SIGCONT), is fenced and exits 1. A read_committed reader
    sees every offset predicted once, as the uninterrupted run: nothing A sent after its last commit shows."""
    count = 20_000
    events = make_events(count, seed=32)
    expected = [
        {**e, "model": {"scope": "partition", "partition": 0, "mixes": 0, **e["model"]}}  # a replica's outputs
        for e in offline(events)[0]
    ]
    produce(apache_kafka.bootstrap_servers, topics["input_topic"], events[:1000])
    # events keep coming (2,000/s) and A commits every 3 s: frozen a second after a commit, A has outputs in its
    # open transaction, whichever client (confluent would have processed a whole backlog in its first interval)
    args = settings_args(
        apache_kafka,
        topics,
        tmp_path,
        batch_size=100,
        kafka_client=client,
        model_scope="partition",
        mix_every=0,
        processing_guarantee="exactly-once",
        commit_interval_ms=3000,
        **store_args("kafka", topics),
    )
    watcher = OutputWatcher(apache_kafka.bootstrap_servers, topics["output_topic"], read_committed=True).start()
    a_log, b_log = tmp_path / "serve-a.log", tmp_path / "serve-b.log"
    a = start_service_process(args, a_log)
    b = None
    flow = threading.Thread(
        target=_trickle, args=(apache_kafka.bootstrap_servers, topics["input_topic"], events[1000:]), daemon=True
    )
    try:
        wait_assigned(a, a_log, topics["input_topic"])
        flow.start()
        wait_until(lambda: watcher.distinct() > 0 or a.poll() is not None, 120, interval=0.005, what="A's first commit")
        time.sleep(1.0)
        assert a.poll() is None, f"A exited with {a.returncode}:\n{tail(a_log)}"
        os.kill(a.pid, signal.SIGSTOP)
        frozen_at = watcher.distinct()
        assert frozen_at < count, "A was done before it was frozen: the test proves nothing"
        b = start_service_process(args, b_log)
        wait_assigned(b, b_log, topics["input_topic"], timeout=180)  # once A's session is over
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(120) == 1, tail(a_log)
        assert "fenced: a newer owner has this instance's partitions" in a_log.read_text(errors="replace"), tail(a_log)
        flow.join(120)
        wait_until(lambda: watcher.distinct() >= count or b.poll() is not None, 180, what="every offset predicted")
        assert stop_process(b, b_log) == 0, tail(b_log)
        watcher.settle()
    finally:
        if flow.is_alive():
            flow.join(120)
        for process in (a, b):
            if process is not None and process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.wait()
        by_source = watcher.stop()

    for path in (a_log, b_log):
        assert not has_traceback(path.read_text(errors="replace")), f"{path.name}:\n{tail(path)}"
    repeats = check_outputs(by_source, expected, input_topic=topics["input_topic"])
    assert repeats == 0, f"{repeats} predictions seen twice by a read_committed reader (frozen at {frozen_at})"


def test_exactly_once_with_the_local_store_is_refused_at_start_up(apache_kafka, topics, tmp_path):
    log_path = tmp_path / "serve.log"
    args = settings_args(apache_kafka, topics, tmp_path, **EXACTLY_ONCE)
    assert exit_code(args, log_path) == 1, tail(log_path)
    assert "--processing-guarantee exactly-once needs --state-store kafka (it is local)" in log_path.read_text()


def test_exactly_once_on_the_embedded_broker_is_refused_at_start_up(broker, topics, tmp_path):
    log_path = tmp_path / "serve.log"
    args = settings_args(broker, topics, tmp_path, **EXACTLY_ONCE, **store_args("kafka", topics))
    assert exit_code(args, log_path) == 1, tail(log_path)
    assert "--processing-guarantee exactly-once cannot hold on the embedded broker" in log_path.read_text()
