"""Scale-out: several service processes share one consumer group in ``--model-scope partition``.

Real processes on both brokers: instances join, one is killed with SIGKILL,
another starts mid-stream. What must hold (docs: concepts/scopes.md, concepts/guarantees.md):

- every (partition, offset) is predicted at least once;
- each partition's replica learns each of its events exactly once: with
  ``--mix-every 0`` its final checkpoint is the offline replay of that
  partition alone, and a repeated prediction is byte for byte the first;
- with mixing on, the mix records are on the mix topic, and every replica's
  weights are the mix it logged (recomputed from the records it names) with
  its partition's events after it stepped offline.

A killed member holds its partitions until its session times out (6 s) and
the broker notices (~3 s): the sizes keep each test within a minute or so.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.learning import learner_from_state, make_learner
from perceptron_stream.learning.mixing import mix_states
from perceptron_stream.state.checkpoint import decode_checkpoint, owner_of

from tests.support.launch import settings_args, start_service_process
from tests.support.partitions import PARTITIONS, dealt_events, held_partitions, produce_dealt, replicas
from tests.support.service import OutputWatcher, has_traceback, source_partition_offset, stop_process, tail
from tests.support.topics import read_all
from tests.support.waiting import wait_until


def _args(broker, topics, tmp_path, store: str = "kafka", **extra) -> list[str]:
    """Partition scope; the local store in one --state-dir every instance shares (a volume mounted by all)."""
    where = {"checkpoint_topic": f"ckpt-{topics['group_id']}"} if store == "kafka" else {}
    return settings_args(
        broker,
        topics,
        tmp_path,
        model_scope="partition",
        state_store=store,
        mix_topic=f"mix-{topics['group_id']}",
        batch_size=100,
        checkpoint_interval_events=300,
        **where,
        **extra,
    )


def _partitions_logged(log: str, what: str) -> set[int]:
    """The partitions of every "assigned ..." or "revoked ..." line of (a part of) a service's log."""
    found = set()
    for line in log.splitlines():
        if f" {what} " in line:
            found |= {int(p) for p in re.findall(r"\[(\d+)\]", line.split(f" {what} ", 1)[1])}
    return found


def _start(args, tmp_path, name: str):
    return start_service_process([*args, "--metrics-port", "0"], tmp_path / f"serve-{name}.log")


# Both stores and both clients on Apache Kafka, and its KIP-848 group protocol; the embedded broker once (the runs
# cost 20-30 s each).
@pytest.mark.parametrize(
    ("kafka_broker", "store", "client"),
    [
        ("apache-kafka", "kafka", "kafka-python"),
        ("apache-kafka", "local", "confluent"),
        ("apache-kafka", "kafka", "confluent-kip-848"),
        ("embedded", "kafka", "kafka-python"),
    ],
    indirect=["kafka_broker"],
)
def test_instances_join_die_and_leave_and_every_replica_learns_each_event_once(
    kafka_broker, topics, tmp_path, store, client
):
    broker = kafka_broker
    protocol = "consumer" if client == "confluent-kip-848" else "classic"
    client = client.removesuffix("-kip-848")
    count = 6000
    events = dealt_events(count, seed=61)
    first, second = events[: count // 2], events[count // 2 :]
    produce_dealt(broker.bootstrap_servers, topics["input_topic"], first)
    args = _args(
        broker,
        topics,
        tmp_path,
        store,
        mix_every=0,
        challengers="averaged",
        kafka_client=client,
        group_protocol=protocol,
    )
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"], by=source_partition_offset).start()
    processes = {}
    try:
        processes["a"] = _start(args, tmp_path, "a")
        processes["b"] = _start(args, tmp_path, "b")
        wait_until(lambda: watcher.distinct() >= count // 4, 90, what="a quarter predicted")
        # b holds partitions before a dies and c comes (a, started first, may have predicted a quarter alone)
        wait_until(lambda: held_partitions((tmp_path / "serve-b.log").read_text()), 60, what="b's partitions")
        processes["a"].send_signal(signal.SIGKILL)  # its partitions idle until its session times out, then move
        processes["a"].wait()
        if protocol == "consumer":  # to b, before c comes: were a's session to end as c joins, the assignor may hand
            # b's partitions to c and a's to b at once (seen under load), and c's join would not be told from a's end
            # (the embedded broker, classic only, evicts a dead member only at the next join)
            wait_until(
                lambda: held_partitions((tmp_path / "serve-b.log").read_text()) == set(range(PARTITIONS)),
                60,
                what="a's partitions moved to b once its session ended",
            )
        b_log_before_c = len((tmp_path / "serve-b.log").read_text())
        processes["c"] = _start(args, tmp_path, "c")  # joins mid-stream: a rebalance takes partitions from b
        wait_until(
            lambda: "assigned" in (tmp_path / "serve-c.log").read_text() or processes["c"].poll() is not None,
            60,
            what="the newcomer's assignment",
        )
        produce_dealt(broker.bootstrap_servers, topics["input_topic"], second)  # the second half reaches b and c
        wait_until(lambda: watcher.distinct() >= count, 120, what="every (partition, offset) predicted")
        for name in ("b", "c"):
            assert stop_process(processes[name], tmp_path / f"serve-{name}.log") == 0, tail(
                tmp_path / f"serve-{name}.log"
            )
        time.sleep(0.5)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        by_source = watcher.stop()

    for name in ("b", "c"):
        assert not has_traceback((tmp_path / f"serve-{name}.log").read_text()), tail(tmp_path / f"serve-{name}.log")
    assert "assigned" in (tmp_path / "serve-c.log").read_text()  # the newcomer got partitions
    if protocol == "consumer":
        # KIP-848: b's first revocation once c came (c's join) gives up some of what b held (every partition, a's
        # session having ended), never all: the rest never stopped.
        b_log = (tmp_path / "serve-b.log").read_text()
        first = b_log.find(" revoked ", b_log_before_c)
        assert first >= 0, tail(tmp_path / "serve-b.log")
        line_start, line_end = b_log.rfind("\n", 0, first) + 1, b_log.find("\n", first)
        held, gave = held_partitions(b_log[:line_start]), _partitions_logged(b_log[line_start:line_end], "revoked")
        assert gave and gave < held, (held, gave, tail(tmp_path / "serve-b.log"))
    checkpoints = replicas(args)
    repeats = 0
    for p in range(PARTITIONS):
        mine = [e for q, e in events if q == p]
        learner, challenger = make_learner(max_features=50_000), make_learner("averaged", max_features=50_000)
        for offset, e in enumerate(mine):
            y_pred, score, mistake = learner.step(e["x"], e["y"])
            challenger.step(e["x"], e["y"])
            outputs = by_source[(p, offset)]  # predicted at least once
            repeats += len(outputs) - 1
            assert len(set(outputs)) == 1, (
                f"partition {p} offset {offset}: repeats differ"
            )  # no mixing: a replay is exact
            got = json.loads(outputs[0])
            assert (got["y_pred"], got["score"], got["mistake"], got["id"]) == (y_pred, score, mistake, e["id"])
            assert got["model"] == {
                "scope": "partition",
                "partition": p,
                "mixes": 0,
                "version": learner.updates,
                "seen": learner.seen,
                "mistakes": learner.mistakes,
            }
        assert checkpoints[p].positions == {(topics["input_topic"], p): len(mine)}
        assert checkpoints[p].model == learner.to_state(), f"partition {p}: not the offline replay of its events"
        assert checkpoints[p].task["challengers"] == {"averaged": challenger.to_state()}  # moved with its partition too
    print(f"repeated predictions after the kill: {repeats}")


def test_mixing_replicas_publish_their_states_and_hold_the_mix_they_logged(kafka_broker, topics, tmp_path):
    broker = kafka_broker
    count = 3000
    events = dealt_events(count, seed=62)
    produce_dealt(broker.bootstrap_servers, topics["input_topic"], events)
    args = _args(broker, topics, tmp_path, mix_every=100)
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"], by=source_partition_offset).start()
    processes = {}
    try:
        processes["a"] = _start(args, tmp_path, "a")
        processes["b"] = _start(args, tmp_path, "b")
        wait_until(lambda: watcher.distinct() >= count, 120, what="every (partition, offset) predicted")
        for name in ("a", "b"):
            assert stop_process(processes[name], tmp_path / f"serve-{name}.log") == 0, tail(
                tmp_path / f"serve-{name}.log"
            )
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        watcher.stop()

    settings = load(ServeSettings, args)
    records = [decode_checkpoint(m.value) for m in read_all(settings.bootstrap_servers, settings.mix_topic)]
    checkpoints = replicas(args)
    mixed_partitions = 0
    for p in range(PARTITIONS):
        final = checkpoints[p]
        mixes = final.task["mixer"]["mixes"]
        assert mixes >= 1, f"partition {p} never mixed"
        [last] = [r for r in records if owner_of(r).task == f"partition-{p}" and r.seq == mixes][-1:]
        own = last.model
        states, mu = [], []
        for q, seq, m in last.task["mix"]["inputs"]:
            source = (
                last
                if q == p
                else [
                    r for r in records[: records.index(last)] if owner_of(r).task == f"partition-{q}" and r.seq == seq
                ][-1]
            )
            states.append(source.model)
            mu.append(m)
            mixed_partitions += q != p
        assert abs(sum(mu) - 1.0) < 1e-9
        learner = learner_from_state(mix_states(own, states, mu))  # the mix it logged
        mine = [e for q, e in events if q == p]
        position = last.positions[(topics["input_topic"], p)]
        for e in mine[position:]:
            learner.step(e["x"], e["y"])
        assert final.positions == {(topics["input_topic"], p): len(mine)}
        assert final.model == learner.to_state(), f"partition {p}: not the mix it logged, then its own events"
    assert mixed_partitions > 0, "no mix used another partition's state"


@pytest.mark.parametrize("kafka_broker", ["apache-kafka", "embedded"], indirect=True)
def test_the_partitions_one_rebalance_assigns_are_restored_with_one_read_of_the_checkpoint_topic(
    kafka_broker, topics, tmp_path, service_thread, monkeypatch
):
    """Each read of the checkpoint topic is a consumer of its own (0.3-0.7 s): 6 partitions restored one read each
    took 4-5 s. Restored together, one read serves them all, and each replica still gets its own checkpoint."""
    from perceptron_stream.kafka import CompactedTopic

    per_partition = 50
    events = dealt_events(PARTITIONS * per_partition, seed=43)
    produce_dealt(kafka_broker.bootstrap_servers, topics["input_topic"], events)
    args = _args(kafka_broker, topics, tmp_path, mix_every=0)
    first = service_thread(args)

    def learned(service) -> bool:
        tasks = [service.app.tasks.for_partition(p) for p in range(PARTITIONS)]
        return all(task is not None and task.learner.seen == per_partition for task in tasks)

    wait_until(lambda: learned(first), 120, what="every partition learned")
    first.stop()  # the final checkpoints

    reads: list[set[bytes]] = []
    read_latest = CompactedTopic.read_latest

    def counted(topic, wanted, *rest, **options):
        reads.append(set(wanted))
        return read_latest(topic, wanted, *rest, **options)

    monkeypatch.setattr(CompactedTopic, "read_latest", counted)
    second = service_thread(args)
    wait_until(lambda: learned(second), 120, what="every partition restored")
    slots = {f"{topics['group_id']}/partition-{p}/{slot}".encode() for p in range(PARTITIONS) for slot in range(3)}
    assert reads == [slots]
    for p in range(PARTITIONS):
        assert second.app.tasks.for_partition(p).positions == {(topics["input_topic"], p): per_partition}
