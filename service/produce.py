"""``perceptron-stream produce``: write a synthetic stream or replay a file into a topic.

A send is only a request: the count this reports is what the brokers
acknowledged, and a run that lost messages says how many and fails with
:class:`ProduceError`, whose message the command prints as one line (exit 1,
or 2 for a bad setting). It sends through the Kafka layer, as the service
does: the service's producer (:class:`perceptron_stream.kafka.CountingProducer`), its
book-keeping of deliveries (:class:`perceptron_stream.kafka.ledger.DeliveryCounts`) and its
classification of errors (:mod:`perceptron_stream.kafka.errors`).

Delayed labels (``--label-topic``): each synthetic event goes to ``--topic``
without its ``y`` (the inline stream's event with ``y`` taken out, keyed by
its id as always), and its label ``{"id": ..., "y": ...}`` goes to the label
topic ``--label-delay-seconds`` later, with the same key: with the same
partition count (the label topic is created with ``--topic``'s, and checked),
a label lands in its point's partition number. A ``--label-missing`` share of
the labels never comes, and the ``--unlabeled`` share has none
(:func:`perceptron_stream.streams.delayed_labels`). One loop sends both
(:class:`PairedSchedule`): each point in its slot of ``--rate``, each label
as it falls due; at the end it waits for the labels still to come, unless
stopped. A seed writes the same points and the same labels, byte for byte
and each topic in the same order; only how the two interleave in time
depends on the clock (with ``--rate 0`` and a delay of 0: point, label,
point, label...). ``--file`` does not combine with ``--label-topic``: a
file's lines are sent as they are, malformed ones included, and splitting
them would mean rewriting them.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Self

from perceptron_stream.config import ProduceSettings
from perceptron_stream.kafka import (
    CountingProducer,
    KafkaFatal,
    KafkaUnavailable,
    TopicSpec,
    ensure_topics,
    partition_counts,
    require_mends,
)
from perceptron_stream.kafka.errors import describe
from perceptron_stream.kafka.ledger import DeliveryCounts
from perceptron_stream.runtime.outage import Outage
from perceptron_stream.streams import csv_columns, delayed_labels, is_csv, read_file, synthetic
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

log = logging.getLogger(__name__)
PROG = "perceptron-stream produce"
#: How long to keep trying to reach the brokers at start (a broker may be starting up).
CONNECT_TIMEOUT_S = 15.0
#: Longest wait, at the end, for the last acknowledgements.
FLUSH_TIMEOUT_S = 60.0
#: Longest single sleep while waiting for a label's time or a point's slot: a stop is noticed within it.
TICK_S = 0.1
#: What :class:`PairedSchedule` yields: a message for ``--topic`` or for ``--label-topic``.
POINT, LABEL = 0, 1


class ProduceError(RuntimeError):
    """The run failed; the message says why. ``status``: the exit code, 1, or 2 for a bad setting."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _fail(message: str, status: int = 1) -> ProduceError:
    return ProduceError(message, status)


def messages(settings: ProduceSettings) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) pairs to write: the key is the event id of synthetic events.

    A file is sent whole unless ``--count`` is given (its default is for the synthetic streams).
    """
    if settings.file is not None:
        source = read_file(settings.file, settings.dense, settings.unlabeled_rows)
        if settings.count and "count" in settings.model_fields_set:
            source = itertools.islice(source, settings.count)
        for value in source:
            yield None, value
        return
    for event in _events(settings):
        yield str(event["id"]).encode(), _encode(event)


def _encode(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _events(settings: ProduceSettings) -> Iterator[dict]:
    events = synthetic(
        settings.stream,
        dimensions=settings.dimensions,
        margin=settings.margin,
        noise=settings.noise,
        drift_every=settings.drift_every,
        seed=settings.seed,
        unlabeled=settings.unlabeled,
    )
    return itertools.islice(events, settings.count) if settings.count else events


def paired_messages(settings: ProduceSettings) -> Iterator[tuple[bytes, bytes, bytes | None]]:
    """(key, point, label or None) for ``--label-topic``: the point is :func:`messages`' event without its ``y``,
    the label ``{"id", "y"}`` is sent later with the same key (None: none is ever sent)."""
    if settings.file is not None:
        raise ValueError("delayed labels are sent for the synthetic streams only, not with --file")
    for point, label in delayed_labels(_events(settings), missing=settings.label_missing, seed=settings.seed):
        yield str(point["id"]).encode(), _encode(point), None if label is None else _encode(label)


class RateLimiter:
    """Spaces calls to ``rate`` per second on average (0: no limit): call k returns at start + k/rate.

    ``clock`` and ``sleep`` are there so tests can check the schedule without waiting for it.
    """

    def __init__(
        self, rate: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ):
        self.interval = 1.0 / rate if rate else 0.0
        self.clock, self.sleep = clock, sleep
        self.next_at = clock()

    def reserve(self) -> float:
        """The time of the next call's slot: now or later, or less than a second ago when running behind."""
        now = self.clock()
        if not self.interval:
            return now
        self.next_at += self.interval
        if self.next_at < now - 1.0:  # fell behind by more than a second: do not burst to catch up
            self.next_at = now
        return self.next_at

    def wait(self) -> None:
        if not self.interval:
            return
        delay = self.reserve() - self.clock()
        if delay > 0:
            self.sleep(delay)


class PairedSchedule:
    """Points and their delayed labels from one loop: iterate for (:data:`POINT` or :data:`LABEL`, key, value).

    ``pairs`` are :func:`paired_messages`' (key, point, label or None). Each
    point goes out in its slot of ``rate`` (:class:`RateLimiter`); its label
    is due ``delay`` seconds after it and goes out then, before the points
    whose slots come later. The delay is the same for every label, so labels
    fall due in their points' order: a FIFO queue is the whole scheduler.
    When the pairs run out, the labels still waiting go out as they fall due.
    ``should_stop`` is asked while waiting (every :data:`TICK_S` at most):
    when it says stop, the iteration ends and :attr:`waiting` holds the
    labels that were never sent. ``clock`` and ``sleep`` as for the limiter.
    """

    def __init__(
        self,
        pairs: Iterable[tuple[bytes, bytes, bytes | None]],
        rate: float,
        delay: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        self.pairs, self.delay = pairs, delay
        self.clock, self.sleep, self.should_stop = clock, sleep, should_stop
        self.limiter = RateLimiter(rate, clock, sleep)
        self.waiting: deque[tuple[float, bytes, bytes]] = deque()  # (due, key, label), due times in order
        self.stopped = False

    def __iter__(self) -> Iterator[tuple[int, bytes, bytes]]:
        for key, point, label in self.pairs:
            slot = self.limiter.reserve()
            yield from self._labels_due_by(slot)
            if not self._wait_until(slot):
                return
            sent_at = self.clock()
            yield POINT, key, point
            if label is not None:
                self.waiting.append((sent_at + self.delay, key, label))
        yield from self._labels_due_by(math.inf)

    def _labels_due_by(self, moment: float) -> Iterator[tuple[int, bytes, bytes]]:
        """The waiting labels due by ``moment``, each at its time."""
        while self.waiting and self.waiting[0][0] <= moment and self._wait_until(self.waiting[0][0]):
            _, key, label = self.waiting[0]
            yield LABEL, key, label
            self.waiting.popleft()  # only once taken: a loop that stops on it leaves it among the unsent

    def _wait_until(self, moment: float) -> bool:
        """Sleep until ``moment``, a tick at a time; False (and :attr:`stopped`) when told to stop first."""
        while True:
            if self.should_stop():
                self.stopped = True
                return False
            left = moment - self.clock()
            if left <= 0:
                return True
            self.sleep(min(left, TICK_S))


def _progress_bar(settings: ProduceSettings, console: Console) -> Progress:
    """On stderr, and on a terminal only: piped into a file or a program, a bar is control codes."""
    return Progress(
        TextColumn("producing to [bold]{task.fields[topic]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[acked]} acknowledged"),
        TimeElapsedColumn(),
        console=console,
        disable=not settings.progress or not console.is_terminal,
    )


class Written(int):
    """What :func:`produce` wrote: the messages the brokers acknowledged in all (an int, as it always was), with
    ``points`` (on ``--topic``) and ``labels`` (on ``--label-topic``) apart, ``unsent_labels`` (labels still
    waiting for their time when the run was stopped), and ``line``, the command's last line."""

    points: int
    labels: int
    unsent_labels: int
    line: str

    def __new__(cls, settings: ProduceSettings, points: int, labels: int = 0, unsent_labels: int = 0) -> Self:
        self = super().__new__(cls, points + labels)
        self.points, self.labels, self.unsent_labels = points, labels, unsent_labels
        if settings.label_topic is None:
            self.line = f"wrote {points} messages to {settings.topic}"
        else:
            self.line = f"wrote {points} points to {settings.topic} and {labels} labels to {settings.label_topic}"
            if unsent_labels:
                self.line += f"; stopped with {unsent_labels} more labels waiting for their time (never sent)"
        return self


def _partition_count(settings: ProduceSettings, topic: str) -> int:
    """Partitions of ``topic``; a topic just created may take a moment to show them."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        count = partition_counts(settings, [topic])[topic]
        if count or time.monotonic() >= deadline:
            return count
        time.sleep(0.2)


def _ensure_label_topic(settings: ProduceSettings, label_topic: str) -> None:
    """The label topic with ``--topic``'s partition count, so that a label lands in its point's partition number."""
    wanted = _partition_count(settings, settings.topic)
    if not wanted:
        raise KafkaUnavailable(f"topic {settings.topic} shows no partitions")
    ensure_topics(settings, [TopicSpec(label_topic, wanted, 1)], create=True, timeout_s=CONNECT_TIMEOUT_S)
    count = _partition_count(settings, label_topic)
    if count != wanted:
        raise _fail(
            f"invalid setting label_topic (--label-topic): topic {label_topic} has {count} partition(s) and topic "
            f"{settings.topic} (--topic) has {wanted}: a label is keyed like its point to land in the same partition "
            f"number, so {label_topic} needs {wanted} partition(s) too (use another label topic, or recreate it); "
            "nothing was written",
            2,
        )


def _check_file(settings: ProduceSettings, console: Console) -> None:
    """A file's header before anything is sent: a CSV that is not comma-separated is refused (exit 2), one without a
    ``y`` column is said to go out unlabeled (its rows are predicted, never learned from; a label column named
    otherwise would be sent as a feature)."""
    if settings.unlabeled_rows and (settings.file is None or not is_csv(settings.file)):
        raise _fail(
            "invalid setting unlabeled_rows (--unlabeled-rows): it reads the empty y cells of a CSV --file; "
            + ("the synthetic streams have no file" if settings.file is None else f"{settings.file} is JSONL"),
            2,
        )
    if settings.file is None:
        if settings.dense:
            raise _fail(
                "invalid setting dense (--dense): it reads a CSV --file's columns as x; the synthetic streams "
                "have their own form",
                2,
            )
        return
    if not is_csv(settings.file):
        if settings.dense:
            raise _fail(
                f"invalid setting dense (--dense): it reads a CSV's columns as x, and {settings.file} is JSONL "
                "(its lines are sent as they are)",
                2,
            )
        return
    try:
        columns = csv_columns(settings.file)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(f"invalid setting file (--file): {exc}", 2) from None
    if "y" not in columns:
        console.print(
            f"note: {settings.file} has no y column (its columns: {', '.join(columns)}): its rows are sent "
            "unlabeled, each column a feature; name the label column y to send labels",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def produce(
    settings: ProduceSettings, should_stop: Callable[[], bool] = lambda: False, console: Console | None = None
) -> Written:
    """Write the messages; returns how many the brokers acknowledged (:class:`Written`), raises :class:`ProduceError`
    when any was not."""
    servers = f"the brokers at {settings.bootstrap_servers} (--bootstrap-servers)"
    if settings.file is not None and not settings.file.is_file():
        raise _fail(f"invalid setting file (--file): {settings.file} is not a readable file", 2)
    _check_file(settings, console or Console(stderr=True))
    # The clients' own lines while connecting go unsaid: brokers that do not answer were some forty ERROR and
    # WARNING lines of kafka-python's, its "Unable to bootstrap" four times, before the one line below said it.
    connecting = Outage(settings.bootstrap_servers)
    connecting.hush()
    try:
        require_mends()  # a kafka-python the mends of its bugs were not checked against: not the brokers' fault
    except KafkaFatal as exc:
        raise _fail(f"{exc}; {exc.hint}; nothing was written") from None
    try:
        ensure_topics(
            settings, [TopicSpec(settings.topic, settings.partitions, 1)], create=True, timeout_s=CONNECT_TIMEOUT_S
        )
        if settings.label_topic is not None:
            _ensure_label_topic(settings, settings.label_topic)
        producer = CountingProducer(settings)
    except (KafkaFatal, KafkaUnavailable, OSError) as exc:
        raise _fail(f"cannot use {servers}: {describe(exc)}; nothing was written") from None
    finally:
        connecting.restore()
    books = {POINT: DeliveryCounts(), LABEL: DeliveryCounts()}
    topics = {POINT: settings.topic}
    if settings.label_topic is not None:
        topics[LABEL] = settings.label_topic
    attempted = {POINT: 0, LABEL: 0}

    def stopping() -> bool:
        return should_stop() or books[POINT].broken or books[LABEL].broken

    schedule: PairedSchedule | None = None
    outgoing: Iterable[tuple[int, bytes | None, bytes]]
    if settings.label_topic is None:
        outgoing = _paced(messages(settings), RateLimiter(settings.rate))
    else:
        outgoing = schedule = PairedSchedule(
            paired_messages(settings), settings.rate, settings.label_delay_seconds, should_stop=stopping
        )
    stopped, file_error = "", None
    progress = _progress_bar(settings, console or Console(stderr=True))
    try:
        with progress:
            total = None if settings.file is not None or not settings.count else settings.count
            tasks = {POINT: progress.add_task("produce", total=total, topic=settings.topic, acked=0)}
            if settings.label_topic is not None:
                tasks[LABEL] = progress.add_task("labels", total=None, topic=settings.label_topic, acked=0)

            def show() -> None:
                for kind, task in tasks.items():
                    progress.update(task, completed=attempted[kind], acked=books[kind].acknowledged)

            next_update = time.monotonic()
            try:
                for kind, key, value in outgoing:
                    if stopping():
                        break
                    attempted[kind] += 1
                    producer.send(topics[kind], key, value, books[kind])
                    if time.monotonic() >= next_update:
                        next_update += 0.1
                        show()
            except ValueError as exc:  # a CSV row that is not an event (the error names file:line)
                if settings.file is None:
                    raise
                file_error = str(exc)
            if books[POINT].broken or books[LABEL].broken:
                stopped = "; stopped sending at the first failure of the brokers"
            if not producer.flush(FLUSH_TIMEOUT_S):  # the messages still unanswered are counted below
                stopped += f"; no answer within {FLUSH_TIMEOUT_S:.0f} s"
            show()
    finally:
        producer.close(10.0)
    acked, failed, errors = {}, 0, Counter[str]()
    for kind, book in books.items():
        with book.lock:
            acked[kind], failed, errors = book.acknowledged, failed + book.failed, errors + book.errors
    if file_error:
        raise _fail(
            f"invalid setting file (--file): {file_error}; {acked[POINT]} of the {attempted[POINT]} messages before it "
            "acknowledged",
            2,
        )
    lost = sum(attempted.values()) - sum(acked.values())
    if lost:
        reasons = [f"{n} × {error}" for error, n in errors.most_common(3)] + (
            [f"{lost - failed} unanswered"] if lost > failed else []
        )
        if settings.label_topic is None:
            counted = (
                f"{acked[POINT]} of {attempted[POINT]} messages acknowledged by {servers} on topic {settings.topic}"
            )
        else:
            counted = (
                f"{acked[POINT]} of {attempted[POINT]} points on topic {settings.topic} and {acked[LABEL]} of "
                f"{attempted[LABEL]} labels on topic {settings.label_topic} acknowledged by {servers}"
            )
        raise _fail(f"{counted}; not acknowledged: {'; '.join(reasons)}{stopped}")
    written = Written(settings, acked[POINT], acked[LABEL], len(schedule.waiting) if schedule is not None else 0)
    log.info("%s", written.line)
    return written


def _paced(
    source: Iterable[tuple[bytes | None, bytes]], limiter: RateLimiter
) -> Iterator[tuple[int, bytes | None, bytes]]:
    """Today's stream (labels inline, or a file): every message for ``--topic``, at the rate."""
    for key, value in source:
        limiter.wait()
        yield POINT, key, value
