"""Scale-out: 1, 2, 4 service instances in one consumer group, ``--model-scope partition``.

    python3 bench/scale_out.py                                    # the table of bench/README.md "Scale-out" (about 10 min)
    python3 bench/scale_out.py --client kafka-python --mix-every 0 --repeats 1   # a quick look

One fresh embedded broker (Tansu). For each client, mix setting and instance
count, a round starts that many ``serve`` processes in a fresh group on a
fresh, empty input topic of ``--partitions`` partitions (``--model-scope
partition --state-store kafka``, the store of deploy/kubernetes/scale-out),
waits until the group is stable (every partition assigned to exactly one
instance, nothing changed for 2 s), then writes the N events with one
confluent-kafka producer as fast as it goes. The events must be written
after the group settled: pre-produced events would be taken by the first
instance to join, and with N = 100,000 the run is shorter than the joins.

- events/s: N / (last output CreateTime − first output CreateTime), as in
  bench/e2e.py;
- CPU µs an event: the instances' CPU time together (user + system, every
  thread, /proc) from the start of the burst until every event was
  acknowledged (/metrics, read every 0.5 s), over N: the cost of the work,
  whatever the parallelism (a run on confluent-kafka lasts 1-2 s: a sample
  at the first acknowledged batch would miss too much of it);
- "group scope": one instance with the default ``--model-scope group``, the
  same way and on the same store: the reference a partition-scope instance
  is compared with.

The burst's producer shares the 2 cores: on confluent-kafka the instances
keep up with it, so the burst lasts much of the span and their events/s
are a floor (the CPU an event counts the instances only).

The machine has 2 cores: 4 instances share them with the broker, so events/s
stops growing at 2; the CPU per event is what shows the cost of scaling out
(extra group members, mix records). Results: bench/results/scale-out-<time>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from bench.e2e import Kafka, Service, cpu_seconds, describe_tree  # noqa: E402

ASSIGNMENT = re.compile(rb"\b(assigned|revoked) (.*)$", re.MULTILINE)


def owned_partitions(log: bytes, topic: str) -> set[int]:
    """The partitions of ``topic`` an instance holds now, from its "assigned"/"revoked" log lines.

    >>> owned_partitions(b"x assigned in[0], in[1], mix[0]\\nx revoked in[0], in[1]\\nx assigned in[1]\\n", "in")
    {1}
    """
    held: set[int] = set()
    for verb, listed in ASSIGNMENT.findall(log):
        named = {int(p) for t, p in re.findall(rb"([^\s,\[]+)\[(\d+)\]", listed) if t.decode() == topic}
        held = held | named if verb == b"assigned" else held - named
    return held


def wait_stable(
    instances: list[Service], topic: str, partitions: int, quiet: float = 2.0, timeout: float = 120.0
) -> None:
    """Until every partition is held by exactly one instance, each instance holds one, and who holds what has
    not changed for ``quiet`` s (from their "assigned"/"revoked" log lines)."""
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        held = [owned_partitions(Path(s.log.name).read_bytes(), topic) for s in instances]
        if held != last:
            last, since = held, time.monotonic()
        spread = sorted(p for h in held for p in h)
        if spread == list(range(partitions)) and all(held) and time.monotonic() - since >= quiet:
            return
        for s in instances:
            if s.process.poll() is not None:
                raise RuntimeError(f"an instance exited with {s.process.returncode}; see {s.log.name}")
        time.sleep(0.2)
    raise RuntimeError(f"the group did not settle in {timeout:.0f} s: {last}")


def burst(bootstrap: str, topic: str, payloads: list[tuple[bytes, bytes]], partitions: int) -> float:
    """Write every payload round robin over the partitions with confluent-kafka (little CPU); seconds taken."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1024 * 1024,
            "acks": "all",
            "broker.address.family": "v4",
        }
    )
    began = time.monotonic()
    for i, (key, value) in enumerate(payloads):
        while True:
            try:
                producer.produce(topic, value, key, partition=i % partitions)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)
    if producer.flush(60):
        raise RuntimeError("the burst was not acknowledged")
    return time.monotonic() - began


def scale_out_run(
    kafka: Kafka,
    client: str,
    instances: int,
    scope: str,
    mix_every: int,
    payloads,
    partitions: int,
    batch: int,
    tag: str,
    logs: Path,
) -> dict:
    input_topic, output_topic, group = f"in-{tag}", f"out-{tag}", f"g-{tag}"
    for name in (input_topic, output_topic, output_topic + ".dlq"):
        kafka.create(name, partitions)
    # the same store in both scopes (the Kafka store, what partition scope runs on in deploy/kubernetes/scale-out)
    extra = [
        "--batch-size",
        str(batch),
        "--model-scope",
        scope,
        "--state-store",
        "kafka",
        "--checkpoint-topic",
        f"ckpt-{tag}",
    ]
    if scope == "partition":
        extra += ["--mix-every", str(mix_every), "--mix-topic", f"mix-{tag}"]
    if client != "kafka-python":
        extra += ["--kafka-client", client]
    services: list[Service] = []
    events = len(payloads)

    def cpu() -> float:
        return sum(cpu_seconds(s.pid) for s in services)

    try:
        for i in range(instances):
            services.append(
                Service(
                    ROOT, kafka.bootstrap, input_topic, output_topic, group, partitions, logs / f"{tag}-{i}.log", extra
                )
            )
        for s in services:
            s.wait_ready()
        wait_stable(services, input_topic, partitions)
        cpu_before = cpu()
        produced_s = burst(kafka.bootstrap, input_topic, payloads, partitions)
        deadline = time.monotonic() + 900
        while (done := sum(s.processed() for s in services)) < events:
            if any(s.process.poll() is not None for s in services) or time.monotonic() > deadline:
                raise RuntimeError(f"{done} of {events} done: an instance exited or time ran out; see {logs}")
            time.sleep(0.5)  # a scrape costs an instance ~1.5 ms of CPU: not too often
        cpu_used = cpu() - cpu_before
        first, last = kafka.timestamp_span_ms(output_topic)  # before the instances leave and the group rebalances
    finally:
        for (
            s
        ) in services:  # SIGTERM to all at once: they checkpoint and leave (stop()'s own SIGTERM then changes nothing)
            if s.process.poll() is None:
                s.process.terminate()
        for s in services:
            try:
                s.stop()
            except Exception as exc:  # the others still get stopped
                print(f"stopping {s.log.name}: {exc!r}", file=sys.stderr)
    seconds = (last - first) / 1000
    return {
        "client": client,
        "scope": scope,
        "instances": instances,
        "mix_every": mix_every if scope == "partition" else None,
        "events": events,
        "burst_s": round(produced_s, 2),
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds, 1),
        "cpu_us_per_event": round(cpu_used / events * 1e6, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000, help="events per run (default 100000)")
    parser.add_argument("--partitions", type=int, default=4, help="input partitions (default 4)")
    parser.add_argument("--instances", default="1,2,4", help="instance counts, comma-separated (default 1,2,4)")
    parser.add_argument("--mix-every", default="0,1000", help="--mix-every values, comma-separated (default 0,1000)")
    parser.add_argument("--client", default="kafka-python,confluent", help="--kafka-client values (default both)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds; medians are reported (default 2)")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--json", type=Path, help="where to write the results (default bench/results/scale-out-<time>.json)"
    )
    args = parser.parse_args()

    import kafka
    from perceptron_stream.broker import EmbeddedBroker
    from perceptron_stream.streams import separable
    from rich.console import Console
    from rich.table import Table

    try:
        import confluent_kafka  # the burst's producer, whatever the client under test
    except ImportError:
        parser.error("the events are written with confluent-kafka: pip install -e '.[confluent]'")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the broker and the instances on the way out
    counts = [int(n) for n in args.instances.split(",")]
    if max(counts) > args.partitions:
        parser.error(
            f"--instances {args.instances}: at most --partitions {args.partitions} (an instance without a partition idles)"
        )
    clients, mixes = args.client.split(","), [int(m) for m in args.mix_every.split(",")]
    console = Console(width=max(120, Console().width))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = Path(tempfile.mkdtemp(prefix=f"scale-out-{stamp}-"))
    payloads = [
        (e["id"].encode(), orjson.dumps(e)) for e in itertools.islice(separable(dimensions=10, noise=0.05), args.events)
    ]
    plan = [(c, 1, "group", 0) for c in clients] + [
        (c, n, "partition", m) for c in clients for m in mixes for n in counts
    ]
    runs: list[dict] = []
    out = args.json or ROOT / "bench" / "results" / f"scale-out-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join(["python3", "bench/scale_out.py", *sys.argv[1:]]),
        "started": stamp,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(),
            "confluent_kafka": confluent_kafka.version(),
            "kafka_python": kafka.__version__,
        },
        "commit": describe_tree(ROOT),
        "runs": runs,
        "logs": str(logs),
    }
    console.print(f"logs: {logs}")
    with EmbeddedBroker(log_path=logs / "broker.log") as broker:
        kafka = Kafka(broker.bootstrap_servers)
        try:
            for r in range(args.repeats):
                for i, (client, n, scope, mix) in enumerate(plan if r % 2 == 0 else plan[::-1]):
                    run = scale_out_run(
                        kafka, client, n, scope, mix, payloads, args.partitions, args.batch_size, f"r{r}-{i}", logs
                    )
                    run["repeat"] = r
                    runs.append(run)
                    console.print(
                        f"repeat {r}: {client:12s} {scope:9s} mix {mix:>5} × {n}: {run['events_per_s']:>10,.0f} events/s, "
                        f"{run['cpu_us_per_event']} µs CPU an event (span {run['seconds']} s, burst written in {run['burst_s']} s)"
                    )
        finally:
            kafka.close()
            out.write_text(json.dumps(record, indent=2) + "\n")  # what ran, even when a run failed

    rows = []
    for client, n, scope, mix in plan:
        mine = [
            r
            for r in runs
            if (r["client"], r["instances"], r["scope"]) == (client, n, scope) and r["mix_every"] in (mix, None)
        ]
        rows.append(
            {
                "client": client,
                "scope": scope,
                "instances": n,
                "mix_every": mix if scope == "partition" else None,
                "events_per_s": statistics.median(r["events_per_s"] for r in mine),
                "cpu_us_per_event": statistics.median(r["cpu_us_per_event"] for r in mine),
            }
        )
    table = Table(
        title=f"scale-out, {args.events:,} events, d=10, {args.partitions} partitions, median of {args.repeats}"
    )
    for name in ("client", "scope", "--mix-every", "instances", "events/s", "CPU µs an event", "CPU vs 1 instance"):
        table.add_column(name, justify="right")
    for row in rows:
        one = next(
            x
            for x in rows
            if (x["client"], x["scope"], x["mix_every"]) == (row["client"], row["scope"], row["mix_every"])
            and x["instances"] == 1
        )
        table.add_row(
            row["client"],
            row["scope"],
            "" if row["mix_every"] is None else str(row["mix_every"]),
            str(row["instances"]),
            f"{row['events_per_s']:,.0f}",
            f"{row['cpu_us_per_event']:.1f}",
            f"{row['cpu_us_per_event'] / one['cpu_us_per_event'] - 1:+.0%}",
        )
    console.print(table)
    record["medians"] = rows
    out.write_text(json.dumps(record, indent=2) + "\n")
    console.print(f"results: {out}  (logs: {logs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
