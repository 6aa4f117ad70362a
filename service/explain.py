"""``perceptron-stream explain``: why a published prediction was made, by the weights that made it.

The model that scored an event has moved on by the time someone asks why (an online perceptron changes on every
mistake). The service's model history (``--model-history-topic``,
:mod:`perceptron_stream.pipeline.history`) keeps what rebuilds it. This command reads three things, committed
records only: the prediction (``TOPIC:PARTITION:OFFSET`` of the output topic), the input event its ``source``
names, and the history of its task (the group's model, or its partition's replica). It rebuilds the model of
the prediction's run as it was before the event, and scores the event with it.

The answer is refused unless the decision and the score are the published ones, to the last bit. A history
that lost a change (a retention that deleted it, at-least-once's crash before it was acknowledged) or one
altered by anyone gives another score. The answer: every feature's part in the score, largest first
(the feature as the event named it, the value as the model saw it, the predicting weight, their product),
then the bias and the score they add up to (:meth:`~perceptron_stream.learning.Perceptron.explain`).
"""

from __future__ import annotations

import json
import sys

from perceptron_stream.config import ExplainSettings
from perceptron_stream.pipeline.history import HistoryError, decode_record, history_key, rebuild
from perceptron_stream.state.checkpoint import GROUP_TASK
from perceptron_stream.wire.inputs import Decoder

PROG = "perceptron-stream explain"


class ExplainError(ValueError):
    """The prediction cannot be explained: what is missing, and why."""


def task_of(prediction: dict) -> str:
    """The task whose history holds a prediction's model: a partition's replica, or the group's model.

    >>> task_of({"model": {"scope": "partition", "partition": 2}}), task_of({"model": {}})
    ('partition-2', 'model')
    """
    model = prediction.get("model") or {}
    return f"partition-{model['partition']}" if model.get("scope") == "partition" else GROUP_TASK


def explain_prediction(prediction: dict, event: bytes, key: bytes | None, records: list[dict]) -> dict:
    """The explanation of ``prediction`` (decoded) of the input ``event`` (its bytes and key), from its task's
    history ``records``; ExplainError when the history does not rebuild the published decision and score."""
    model = prediction.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("run"), str) or type(model.get("seen")) is not int:
        raise ExplainError("the prediction names no model run: it was published without --model-history-topic")
    decoder = Decoder(max_message_bytes=1 << 30, max_features=1_000_000)  # the service took it: no limit here
    decoded = decoder.decode_many([event], [key], True)
    if not decoded.xs:
        raise ExplainError(f"its input event does not decode ({decoded.rejected[0][1].reason})")
    x = decoded.xs[0]
    try:
        learner = rebuild(records, model["run"], model["seen"])
        (y_pred, score, _), parts, bias = learner.explain_step(x, None)
    except HistoryError as exc:
        raise ExplainError(str(exc)) from None
    if repr(score) != repr(prediction.get("score")) or y_pred != prediction.get("y_pred"):
        raise ExplainError(
            f"the history rebuilds a model that scores this event {score!r} ({y_pred:+d}), where the prediction "
            f"published {prediction.get('score')!r} ({prediction.get('y_pred')}): a change of run {model['run']} is "
            "missing (retention, or a crash before it was acknowledged under at-least-once) or the history was altered"
        )
    ranked = sorted(parts, key=lambda part: -abs(part[3]))
    return {
        "id": prediction.get("id"),
        "source": prediction.get("source"),
        "y_pred": y_pred,
        "y": prediction.get("y"),
        "score": score,
        "model": model,
        "reasons": [{"feature": f, "value": v, "weight": w, "contribution": c} for f, v, w, c in ranked],
        "bias": bias,
    }


def text(answer: dict) -> str:
    """The explanation for a person: the decision, then every feature's part, largest first.

    >>> print(text({"id": "c-1", "source": {"topic": "points", "partition": 0, "offset": 7}, "y_pred": -1,
    ...             "y": None, "score": -1.5, "model": {"run": "ab12", "version": 3, "seen": 8},
    ...             "reasons": [{"feature": "debt", "value": 2.0, "weight": -1.0, "contribution": -2.0}],
    ...             "bias": 0.5}))
    event c-1 (points[0] offset 7): decision -1, score -1.5
    model run ab12, version 3, its event 8 (rebuilt from the model history: the same score, to the last bit)
    feature  value  weight  contribution
    debt       2.0    -1.0          -2.0
    bias                             0.5
    """
    source = answer["source"] or {}
    model = answer["model"]
    label = "" if answer["y"] is None else f", label {answer['y']}"
    lines = [
        f"event {answer['id']} ({source.get('topic')}[{source.get('partition')}] offset {source.get('offset')}): "
        f"decision {answer['y_pred']}, score {answer['score']!r}{label}",
        f"model run {model['run']}, version {model.get('version')}, its event {model['seen']} "
        "(rebuilt from the model history: the same score, to the last bit)",
    ]
    rows = [
        (str(r["feature"]), repr(r["value"]), repr(r["weight"]), repr(r["contribution"])) for r in answer["reasons"]
    ]
    rows.append(("bias", "", "", repr(answer["bias"])))
    head = ("feature", "value", "weight", "contribution")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(4)]
    for row in [head, *rows]:
        lines.append(
            "  ".join([row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])])
        )
    return "\n".join(line.rstrip() for line in lines)


def run_explain(settings: ExplainSettings) -> int:
    """Read the prediction, its event and its task's history; print the explanation (exit 0), or why not (1)."""
    from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable, read_partition
    from perceptron_stream.kafka.admin import partition_counts
    from perceptron_stream.runtime.outage import Outage

    Outage(settings.bootstrap_servers).hush()  # one line says what failed, not the clients' own first
    topic, partition, offset = settings.prediction.rsplit(":", 2)
    timeout = settings.timeout_seconds

    def one(topic: str, partition: int, offset: int) -> tuple[bytes | None, bytes | None]:
        for at, key, value in read_partition(settings, topic, partition, offset, timeout):
            if at == offset:
                return key, value
            break
        raise ExplainError(f"no committed record at {topic}:{partition}:{offset}")

    try:
        _, value = one(topic, int(partition), int(offset))
        try:
            prediction = json.loads(value or b"")
        except ValueError:
            raise ExplainError(f"{settings.prediction} is not a prediction (not JSON)") from None
        source = prediction.get("source") if isinstance(prediction, dict) else None
        if not isinstance(source, dict) or "score" not in prediction:
            raise ExplainError(f"{settings.prediction} is not a prediction (no source or score)")
        key, event = one(source["topic"], int(source["partition"]), int(source["offset"]))
        wanted = history_key(settings.group_id, task_of(prediction))
        records, unread = [], 0
        partitions = partition_counts(settings, [settings.model_history_topic])[settings.model_history_topic]
        if not partitions:
            raise ExplainError(f"topic {settings.model_history_topic} does not exist")
        for p in range(partitions):
            for _, record_key, record in read_partition(settings, settings.model_history_topic, p, None, timeout):
                if record_key == wanted and record is not None:
                    try:
                        records.append(decode_record(record))
                    except HistoryError:
                        unread += 1  # counted: a rebuild that needs it fails, naming the run
        answer = explain_prediction(prediction, event or b"", key, records)
    except (ExplainError, KafkaFatal, KafkaUnavailable) as exc:
        print(f"{PROG}: {settings.prediction}: {exc}", file=sys.stderr)
        return 1
    if unread:
        print(f"{PROG}: {unread} record(s) of {wanted.decode()} in the history do not read; left out", file=sys.stderr)
    print(json.dumps(answer, indent=2) if settings.format == "json" else text(answer))
    return 0
