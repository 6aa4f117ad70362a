"""``perceptron-stream produce``: write a synthetic stream or replay a file into a topic.

A send is only a request: the count this reports is what the brokers
acknowledged, and a run that lost messages says how many and fails with
:class:`ProduceError`, whose message the command prints as one line (exit 1,
or 2 for a bad setting).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from kafka.errors import KafkaError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from service.config import ProduceSettings
from service.kafka import KafkaFatal, KafkaUnavailable, TopicSpec, close_producer, ensure_topics, make_producer
from service.kafka.kafka_python import REFUSED_ERRORS
from service.streams import read_file, synthetic

log = logging.getLogger(__name__)
PROG = "perceptron-stream produce"
#: How long to keep trying to reach the brokers at start (a broker may be starting up).
CONNECT_TIMEOUT_S = 15.0
#: Longest wait, at the end, for the last acknowledgements.
FLUSH_TIMEOUT_S = 60.0


class ProduceError(RuntimeError):
    """The run failed; the message says why. ``status``: the exit code, 1, or 2 for a bad setting."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _describe(exc: BaseException) -> str:
    """The error's class and message once (kafka-python's messages often start with the class already)."""
    text = re.sub(r"^\[Error -?\d+\] ", "", str(exc).strip())
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}".rstrip(": ")


def _fail(message: str, status: int = 1) -> ProduceError:
    return ProduceError(message, status)


def messages(settings: ProduceSettings) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) pairs to write: the key is the event id of synthetic events.

    A file is sent whole unless ``--count`` is given (its default is for the synthetic streams).
    """
    if settings.file is not None:
        source = read_file(settings.file)
        if settings.count and "count" in settings.model_fields_set:
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
    """Spaces calls to ``rate`` per second on average (0: no limit): call k returns at start + k/rate.

    ``clock`` and ``sleep`` are there so tests can check the schedule without waiting for it.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.interval = 1.0 / rate if rate else 0.0
        self.clock, self.sleep = clock, sleep
        self.next_at = clock()

    def wait(self) -> None:
        if not self.interval:
            return
        self.next_at += self.interval
        delay = self.next_at - self.clock()
        if delay > 0:
            self.sleep(delay)
        elif delay < -1.0:  # fell behind by more than a second: do not burst to catch up
            self.next_at = self.clock()


class Deliveries:
    """The brokers' answers, counted as they arrive (callbacks run on the producer's I/O thread)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acknowledged = self.failed = 0
        self.errors: Counter[str] = Counter()
        self.broken = False  # a failure that is not about one message: the brokers are away or refuse the topic

    def ok(self, _metadata=None) -> None:
        with self.lock:
            self.acknowledged += 1

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            self.failed += 1
            self.errors[_describe(exc)] += 1
            self.broken |= not isinstance(exc, REFUSED_ERRORS)


def _progress_bar(settings: ProduceSettings, console: Console) -> Progress:
    """On stderr, and on a terminal only: piped into a file or a program, a bar is control codes."""
    return Progress(TextColumn("producing to [bold]{task.fields[topic]}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[acked]} acknowledged"), TimeElapsedColumn(), console=console,
                    disable=not settings.progress or not console.is_terminal)


def produce(settings: ProduceSettings, should_stop: Callable[[], bool] = lambda: False, console: Console | None = None) -> int:
    """Write the messages; returns how many the brokers acknowledged, raises :class:`ProduceError` when any was not."""
    servers = f"the brokers at {settings.bootstrap_servers} (--bootstrap-servers)"
    if settings.file is not None and not settings.file.is_file():
        raise _fail(f"invalid setting file (--file): {settings.file} is not a readable file", 2)
    try:
        ensure_topics(settings, [TopicSpec(settings.topic, settings.partitions, 1)], create=True, timeout_s=CONNECT_TIMEOUT_S)
        producer = make_producer(settings)
    except (KafkaFatal, KafkaUnavailable, OSError) as exc:
        raise _fail(f"cannot use {servers}: {_describe(exc)}; nothing was written") from None
    deliveries, limiter, attempted, stopped, file_error = Deliveries(), RateLimiter(settings.rate), 0, "", None
    progress = _progress_bar(settings, console or Console(stderr=True))
    try:
        with progress:
            total = None if settings.file is not None or not settings.count else settings.count
            task = progress.add_task("produce", total=total, topic=settings.topic, acked=0)
            next_update = time.monotonic()
            try:
                for key, value in messages(settings):
                    if should_stop() or deliveries.broken:
                        break
                    limiter.wait()
                    attempted += 1
                    try:
                        producer.send(settings.topic, key=key, value=value).add_callback(deliveries.ok).add_errback(deliveries.fail)
                    except KafkaError as exc:  # refused before sending (too large), or no brokers within max_block_ms
                        deliveries.fail(exc)
                    if time.monotonic() >= next_update:
                        next_update += 0.1
                        progress.update(task, completed=attempted, acked=deliveries.acknowledged)
            except ValueError as exc:  # a CSV row that is not an event (the error names file:line)
                if settings.file is None:
                    raise
                file_error = str(exc)
            if deliveries.broken:
                stopped = "; stopped sending at the first failure of the brokers"
            try:
                producer.flush(timeout=FLUSH_TIMEOUT_S)
            except KafkaError:  # the messages still unanswered are counted below
                stopped += f"; no answer within {FLUSH_TIMEOUT_S:.0f} s"
            progress.update(task, completed=attempted, acked=deliveries.acknowledged)
    finally:
        close_producer(producer, 10.0)
    with deliveries.lock:
        acked, failed, errors = deliveries.acknowledged, deliveries.failed, deliveries.errors.most_common(3)
    if file_error:
        raise _fail(f"invalid setting file (--file): {file_error}; {acked} of the {attempted} messages before it acknowledged", 2)
    lost = attempted - acked
    if lost:
        reasons = [f"{n} × {error}" for error, n in errors] + ([f"{lost - failed} unanswered"] if lost > failed else [])
        raise _fail(f"{acked} of {attempted} messages acknowledged by {servers} on topic {settings.topic}; "
                    f"not acknowledged: {'; '.join(reasons)}{stopped}")
    log.info("%d messages acknowledged on %s", acked, settings.topic)
    return acked
