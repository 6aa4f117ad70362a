"""What does GET /model cost the loop?  Events/s with 8 clients polling /model of a 50,000-feature model, beside none.

    python3 bench/model_polling.py                       # the line of bench/README.md
    python3 bench/model_polling.py --events 100000 --clients 8 --features 50000

One run, on the embedded broker: a backlog of ``--events`` 10-feature named
events on a topic; the service (a child process, ``--initial-model`` of a
``--features``-wide model, learning on) processes it twice, once alone and
once while ``--clients`` threads of another process ask for ``/model`` in a
loop, in alternating order over ``--repeats`` rounds (each run a new consumer
group reading the same backlog). Events/s is the backlog over the time from
the service's first counted event to its last (``perceptron_events_total``,
read from /metrics every 0.1 s). Reports served to the clients are counted.
No timing is asserted anywhere in tests; the test of the same situation
counts the weight copies per model version instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perceptron_stream.broker import EmbeddedBroker, free_port  # noqa: E402


def _get(url: str, timeout: float = 5.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except OSError:
        return None


def _events_total(metrics: str) -> float:
    body = _get(metrics + "/metrics") or b""
    return sum(
        float(line.split()[-1]) for line in body.decode().splitlines() if line.startswith("perceptron_events_total{")
    )


def _pollers(url: str, clients: int, stop: threading.Event, served: list[int]) -> list[threading.Thread]:
    def poll(i: int) -> None:
        while not stop.is_set():
            if _get(f"{url}/model") is not None:
                served[i] += 1

    threads = [threading.Thread(target=poll, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    return threads


def run_once(bootstrap: str, topic: str, model: Path, events: int, clients: int, tag: str, work: Path) -> dict:
    port = free_port()
    metrics = f"http://127.0.0.1:{port}"
    log = open(work / f"service-{tag}.log", "wb")  # noqa: SIM115 — the service's log: the finally below closes it once the service ended
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perceptron_stream.cli",
            "serve",
            "--bootstrap-servers",
            bootstrap,
            "--input-topic",
            topic,
            "--output-topic",
            f"out-{tag}",
            "--dlq-topic",
            f"dlq-{tag}",
            "--group-id",
            f"g-{tag}",
            "--state-store",
            "none",
            "--metrics-port",
            str(port),
            "--initial-model",
            str(model),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    stop, served = threading.Event(), [0] * clients
    try:
        while _get(metrics + "/model?limit=1") is None:  # up, with the initial model
            time.sleep(0.1)
        threads = _pollers(metrics, clients, stop, served)
        first = last = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done, now = _events_total(metrics), time.monotonic()
            if done and first is None:
                first = (now, done)
            if done >= events:
                last = (now, done)
                break
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        service.terminate()
        service.wait(30)
        log.close()
    if last is None or first is None:
        raise SystemExit(f"{tag}: the service did not process {events} events in 600 s (see {work})")
    rate = (last[1] - first[1]) / (last[0] - first[0])
    return {"clients": clients, "events_per_s": rate, "reports_served": sum(served)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=50_000, help="features of the served model")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds of (none, clients), alternating which goes first"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-model-polling-"))
    names = [f"feature-{i:05d}" for i in range(args.features)]
    model = work / "wide.json"
    model.write_text(
        json.dumps(
            {
                "kind": "perceptron-stream.model",
                "format": 1,
                "variant": "plain",
                "input": "named",
                "features": names,
                "weights": [((i * 7919) % 2001 - 1000) / 1000 for i in range(args.features)],
                "bias": 0.0,
                "source": "bench/model_polling.py",
            }
        )
    )
    broker = EmbeddedBroker("127.0.0.1", free_port()).start()
    try:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        topic = "points"
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        admin.create_topics([NewTopic(topic, 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=20, batch_size=256 * 1024)
        for i in range(args.events):
            features = {names[(i * 13 + j) % args.features]: 1.0 for j in range(10)}
            producer.send(topic, json.dumps({"id": i, "features": features, "y": 1 if i % 3 else -1}).encode())
        producer.flush()
        producer.close()
        runs = []
        for r in range(args.repeats):
            order = (0, args.clients) if r % 2 == 0 else (args.clients, 0)
            for clients in order:
                run = run_once(broker.bootstrap_servers, topic, model, args.events, clients, f"r{r}-c{clients}", work)
                runs.append(run)
                print(
                    f"round {r + 1}: {clients} clients polling /model: {run['events_per_s']:,.0f} events/s "
                    f"({run['reports_served']:,} reports served)",
                    flush=True,
                )
    finally:
        broker.stop()
    alone = [x["events_per_s"] for x in runs if x["clients"] == 0]
    polled = [x["events_per_s"] for x in runs if x["clients"]]
    print(
        f"{args.features:,}-feature model, {args.events:,} events: {min(alone):,.0f}-{max(alone):,.0f} events/s alone, "
        f"{min(polled):,.0f}-{max(polled):,.0f} with {args.clients} clients polling /model "
        f"({min(p / a for p, a in zip(polled, alone)):.2f}-{max(p / a for p, a in zip(polled, alone)):.2f}x)"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"features": args.features, "events": args.events, "runs": runs}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
