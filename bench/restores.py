"""How long an instance takes to restore the partitions one assignment gives it (partition scope, Kafka store).

    python3 bench/restores.py                          # 6 partitions on the embedded broker
    python3 bench/restores.py --broker apache-kafka    # on Apache Kafka (Java and Maven, as the tests run it)
    python3 bench/restores.py --partitions 12

One fresh broker; an input topic of N partitions; one `serve` process in a
fresh group (``--model-scope partition --state-store kafka --mix-every 0``),
run three times, each stopped once it has restored every partition: with no
checkpoint yet, after events came (the first run learned nothing, so still
none), and with every partition's checkpoint. Each run's figure is read from
its log's timestamps (milliseconds): from its "assigned" line to its last
restore line ("no checkpoint yet of partition-N", "restored checkpoint ... of
partition-N"), with the steps between restore lines. bench/README.md
"Restoring the partitions of one assignment" has the figures.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.brokers import new_broker
from tests.support.launch import settings_args, start_service_process
from tests.support.service import make_events, stop_process
from tests.support.topics import create_topic, produce

RESTORED = re.compile(r"no checkpoint yet of partition-|restored checkpoint \d+ of partition-")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _stamp(line: str) -> float | None:
    m = STAMP.match(line)
    return datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def run(broker, topics: dict, root: Path, partitions: int, label: str) -> tuple[float, list[float]]:
    """One service run until it restored every partition: (assignment to last restore, the steps), in seconds."""
    log = root / f"serve-{label}.log"
    args = settings_args(
        broker,
        topics,
        root,
        model_scope="partition",
        state_store="kafka",
        mix_every=0,
        checkpoint_topic=f"{topics['group_id']}.checkpoints",
        mix_topic=f"{topics['group_id']}.mix",
    )
    process = start_service_process(args, log)
    deadline = time.monotonic() + 180
    try:
        while len(RESTORED.findall(log.read_text())) < partitions:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"the service did not restore {partitions} partitions:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
    finally:
        stop_process(process, log)
    lines = log.read_text().splitlines()
    assigned = next(_stamp(line) for line in lines if " assigned " in line and "assigned nothing" not in line)
    restores = [_stamp(line) for line in lines if RESTORED.search(line)]
    assert assigned is not None and None not in restores
    steps = [b - a for a, b in zip([assigned, *restores], restores)]  # type: ignore[operator]
    return restores[-1] - assigned, steps  # type: ignore[operator]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=["embedded", "apache-kafka"], default="embedded")
    parser.add_argument("--partitions", type=int, default=6)
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="restores-"))
    with new_broker(options.broker, root / "broker") as broker:
        tag = uuid.uuid4().hex[:8]
        topics = {
            "input_topic": f"in-{tag}",
            "output_topic": f"out-{tag}",
            "dlq_topic": f"dlq-{tag}",
            "group_id": f"g-{tag}",
        }
        create_topic(broker.bootstrap_servers, topics["input_topic"], partitions=options.partitions)
        for label in ("no checkpoint", "after events", "with checkpoints"):
            if label == "after events":
                events = make_events(300 * options.partitions, seed=1)
                keys = [f"k{i}".encode() for i in range(len(events))]
                produce(broker.bootstrap_servers, topics["input_topic"], events, keys=keys)
            total, steps = run(broker, topics, root, options.partitions, label.replace(" ", "-"))
            print(
                f"{options.broker}, {options.partitions} partitions, {label}: {total:.2f} s from the assignment to the "
                f"last restore; steps {', '.join(f'{s:.2f}' for s in steps)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
