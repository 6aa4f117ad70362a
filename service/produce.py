"""``perceptron-stream produce``: write a synthetic stream or replay a file into a topic."""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from service.config import ProduceSettings
from service.kafka import TopicSpec, ensure_topics, make_producer
from service.streams import read_file, synthetic

log = logging.getLogger(__name__)


def messages(settings: ProduceSettings) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) pairs to write: the key is the event id when it has one."""
    if settings.file is not None:
        source = read_file(settings.file)
        if settings.count:
            source = itertools.islice(source, settings.count)
        for value in source:
            yield None, value
        return
    events = synthetic(settings.stream, dimensions=settings.dimensions, margin=settings.margin, noise=settings.noise,
                       drift_every=settings.drift_every, seed=settings.seed, unlabeled=settings.unlabeled)
    if settings.count:
        events = itertools.islice(events, settings.count)
    for event in events:
        yield str(event["id"]).encode(), json.dumps(event, separators=(",", ":")).encode()


class RateLimiter:
    """Spaces calls to ``rate`` per second on average (0: no limit)."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate if rate else 0.0
        self.next_at = time.monotonic()

    def wait(self) -> None:
        if not self.interval:
            return
        self.next_at += self.interval
        delay = self.next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:  # fell behind by more than a second: do not burst to catch up
            self.next_at = time.monotonic()


def produce(settings: ProduceSettings, should_stop=lambda: False) -> int:
    """Write the messages; returns how many were acknowledged."""
    ensure_topics(settings, [TopicSpec(settings.topic, settings.partitions, 1)], create=True, timeout_s=30.0)
    producer = make_producer(settings)
    limiter = RateLimiter(settings.rate)
    total = settings.count or None
    sent = 0
    progress = Progress(TextColumn("producing to [bold]{task.fields[topic]}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), disable=not settings.progress, transient=False)
    try:
        with progress:
            task = progress.add_task("produce", total=total, topic=settings.topic)
            for key, value in messages(settings):
                if should_stop():
                    break
                limiter.wait()
                producer.send(settings.topic, key=key, value=value)
                sent += 1
                if sent % 1000 == 0:
                    progress.update(task, completed=sent)
            producer.flush()
            progress.update(task, completed=sent)
    finally:
        producer.close(timeout=10)
    log.info("wrote %d messages to %s", sent, settings.topic)
    return sent
