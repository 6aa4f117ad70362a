"""Delivery: a batch's outputs acknowledged by the brokers, however long they are away, before anything moves on.

The loop hands every output of a batch to the stream's ``send``; :meth:`Delivery.flush`
then waits for the brokers' acknowledgements, ``FLUSH_WAIT_S`` at a time,
logging an outage and marking the brokers away on ``/readyz`` between waits
(a stop ends the wait: the batch is left unacknowledged, and so neither
checkpointed nor committed). An output the brokers refuse for good becomes a
dead letter (:mod:`perceptron_stream.wire.outputs`, the one builder) instead of stopping
the service for one event.

Most such outputs are never sent: :meth:`Delivery.sender` measures each
output against its topic's ``max.message.bytes`` (:class:`~perceptron_stream.kafka.RecordLimits`,
read at start-up) before the stream sees it, and puts an ``output_refused``
dead letter in place of one too large (a dead letter too large for its own
topic is cut to fit, keeping its source and reason). That is what keeps a
too-large output from stopping the service under exactly-once: a refused
record would fail the whole transaction, and every retry of its span would
meet it again; measured first, it never joins the transaction, and every
other event's outputs stay in it exactly once.

Under exactly-once the batch's outputs are in the open transaction: a flush
that fails aborts it (:class:`~perceptron_stream.kafka.Aborted`, or
:class:`~perceptron_stream.kafka.Fenced`), raised as it is for the checkpointer to stop
the service (:meth:`~perceptron_stream.runtime.transaction.Transaction.lost`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson
from perceptron_stream.kafka import Aborted, DeliveryError, Fenced, KafkaFatal, RecordLimits, Refused
from perceptron_stream.runtime.retry import StartupError, fatal
from perceptron_stream.wire.messages import Rejection
from perceptron_stream.wire.outputs import dead_letter_value, refit_dead_letter

log = logging.getLogger("perceptron_stream")

#: How long one flush waits before the loop logs an outage and waits again.
FLUSH_WAIT_S = 10.0


class Delivery:
    def __init__(self, settings, health, metrics, stopping: Callable[[], bool]):
        self.settings, self.health, self.metrics, self.stopping = settings, health, metrics, stopping
        self.limits: RecordLimits | None = None  # the topics' record limits, once start-up read them

    def sender(self, stream) -> Callable[[str, bytes | None, bytes], None]:
        """``stream.send`` for the loop's outputs, each measured against its topic's limit first: one too large
        is replaced by a dead letter (:meth:`_too_large`) and never sent."""
        limits, send = self.limits, stream.send
        if limits is None:
            return send
        of, keyed, too_large = limits.of, limits.keyed, self._too_large

        def sized(topic: str, key: bytes | None, value: bytes) -> None:
            if key is None:
                if topic in keyed or len(value) > of(topic):
                    return too_large(send, topic, key, value)
            elif len(value) + len(key) > of(topic):
                return too_large(send, topic, key, value)
            send(topic, key, value)

        return sized

    def _too_large(self, send, topic: str, key: bytes | None, value: bytes) -> None:
        """An output its topic would refuse for good: a mix or history record is left out, a dead letter cut to fit,
        any other output replaced by an ``output_refused`` dead letter naming the topic and its setting."""
        s, limits = self.settings, self.limits
        assert limits is not None
        why = limits.too_large(topic, key, value)
        if topic == s.mix_topic:
            log.error("a mix record was not published: %s; the replica mixed without publishing it", why)
            self.metrics.mix_rejected.labels("refused").inc()
            return
        if topic == s.model_history_topic:  # (the history cuts its records to fit: never expected)
            log.error("a model history record was not published: %s; explain says which versions it lacks", why)
            return
        if topic == s.dlq_topic:
            key, value = refit_dead_letter(key, value, limits.of(topic))
            log.warning("a dead letter was cut to fit: %s", why)
            send(topic, key, value)
            return
        send(s.dlq_topic, None, self._refused_letter(value, f"this event's output could not be published: {why}"))

    def _refused_letter(self, value: bytes, error: str) -> bytes:
        """The ``output_refused`` dead letter of the event whose output ``value`` is (without key or raw value: they
        may be what was too large), naming where its input is; counted."""
        s = self.settings
        doc = orjson.loads(value)
        source = doc.get("label_source") or doc["source"]  # every output carries its input's position (an outcome's
        # input is its label)
        error = f"{error}; the input is at source"
        log.error("%s at %s", error, source)
        self.metrics.rejected.labels("output_refused").inc()
        return dead_letter_value(
            Rejection("output_refused", error),
            None,
            source["topic"],
            source["partition"],
            source["offset"],
            max_bytes=s.max_message_bytes
            if self.limits is None
            else min(s.max_message_bytes, self.limits.of(s.dlq_topic)),
        )

    def flush(self, stream) -> None:
        """Wait for every acknowledgement, however long the brokers are away (DeliveryError once stopping)."""
        while True:
            try:
                refused = stream.flush(timeout_s=FLUSH_WAIT_S)
                self.health.broker_ok = True
                if refused:
                    self._replace_refused(stream, refused)
                return
            except (Aborted, Fenced):  # exactly-once: the transaction is over
                raise
            except KafkaFatal as exc:
                raise fatal(exc, "send the outputs") from None
            except DeliveryError as exc:
                self.health.broker_failed("send the outputs", exc)  # one line per outage, naming the setting
                self.health.beat()  # the loop is alive, waiting for the brokers
                if self.stopping():
                    raise
                log.debug("%s; waiting for the brokers", exc)

    def _replace_refused(self, stream, refused: list[Refused]) -> None:
        """An output the brokers refuse for good (larger than the topic allows, say) becomes a dead letter without
        key or raw value: waiting for it would stop the service for one event."""
        s = self.settings
        for r in refused:
            if r.topic == s.mix_topic:
                log.error(
                    "the brokers refused a mix record (%d bytes) for good: %s; the replica mixed without publishing it",
                    len(r.value),
                    r.error.__class__.__name__,
                )
                self.metrics.mix_rejected.labels("refused").inc()
                continue
            what = "dead letter" if r.topic == s.dlq_topic else "output"
            error = (
                f"the brokers refused this event's {what} ({len(r.value)} bytes, key {len(r.key or b'')} bytes) for good: "
                f"{r.error.__class__.__name__}"
            )
            stream.send(s.dlq_topic, None, self._refused_letter(r.value, error))
        again = stream.flush(timeout_s=FLUSH_WAIT_S)
        if again:
            raise StartupError(f"the brokers refuse even a short dead letter on {s.dlq_topic}: {again[0].error!r}")
