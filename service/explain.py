"""``perceptron-stream explain`` and ``model at VERSION``: why a published prediction was made, by the weights that
made it; and any version of a model, as a model file.

The model that scored an event has moved on by the time someone asks why (an online perceptron changes on every
mistake). The service's model history (``--model-history-topic``,
:mod:`perceptron_stream.pipeline.history`) keeps what rebuilds it. This command reads three things, committed
records only: the prediction (``TOPIC:PARTITION:OFFSET`` of the output topic), the input event its ``source``
names, and the history of its task (the group's model, or its partition's replica). It rebuilds the model of
the prediction's run as it was before the event, and scores the event with it.

The rebuilt score is checked against the published one: the answer says ``equal`` when they are the same float
(and the decision the same), and the command exits 1 otherwise, naming the version. A history that lost a change
(a retention that deleted it, at-least-once's crash before it was acknowledged) or one altered by anyone gives
another score, or none (two different records at one place). The answer: every feature's part in the score,
largest first
(the feature as the event named it, the value as the model saw it, the predicting weight, their product),
then the bias and the score they add up to (:meth:`~perceptron_stream.learning.Perceptron.explain`).
"""

from __future__ import annotations

import json
import sys

from perceptron_stream.config import ExplainSettings, ModelAtSettings, signing_key
from perceptron_stream.pipeline.history import (
    HistoryError,
    challenger_key,
    decode_record,
    history_key,
    rebuild,
    runs_at,
)
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


def explain_prediction(
    prediction: dict, event: bytes, key: bytes | None, records: list[dict], challenger: str | None = None
) -> dict:
    """The explanation of ``prediction`` (decoded) of the input ``event`` (its bytes and key), from its task's
    history ``records``: the rebuilt model's ``score`` beside the ``published_score``, ``equal`` when they are the
    same float (and the decision the same), every feature's part. ExplainError, naming the version, when the
    history cannot rebuild it.

    With ``challenger`` (its name; ``records`` its history, ``--history-challengers``): what that challenger
    scored the event, and why, by its weights then (its own ``version``); it publishes no score, so
    ``published_score`` and ``equal`` are None: only the history's own checks (altered, cut, a gap) hold."""
    model = prediction.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("run"), str) or type(model.get("seen")) is not int:
        raise ExplainError("the prediction names no model run: it was published without --model-history-topic")
    where = (
        f"version {model.get('version')} of run {model['run']}"
        if challenger is None
        else f"challenger {challenger}'s model at event {model['seen']} of run {model['run']}"
    )
    decoder = Decoder(max_message_bytes=1 << 30, max_features=1_000_000)  # the service took it: no limit here
    decoded = decoder.decode_many([event], [key], True)
    if not decoded.xs:
        raise ExplainError(f"its input event does not decode ({decoded.rejected[0][1].reason})")
    x, y = decoded.xs[0], decoded.ys[0]
    try:
        learner = rebuild(records, model["run"], seen=model["seen"])
        version = model.get("version") if challenger is None else learner.updates
        # stepped as the service stepped it, its label too (a scaler admits a labeled event's new features before
        # it scores it): the parts and score come before the step learns, in a copy thrown away after
        (y_pred, score, _), parts, bias = learner.explain_step(x, y)
    except HistoryError as exc:
        raise ExplainError(f"{where} cannot be rebuilt: {exc}") from None
    published = prediction.get("score") if challenger is None else None
    ranked = sorted(parts, key=lambda part: -abs(part[3]))
    return {
        "id": prediction.get("id"),
        "source": prediction.get("source"),
        **({} if challenger is None else {"challenger": challenger}),
        "version": version,
        "run": model["run"],
        "seen": model["seen"],
        "y_pred": y_pred,
        "published_y_pred": prediction.get("y_pred") if challenger is None else None,
        "y": prediction.get("y"),
        "score": score,
        "published_score": published,
        "equal": None
        if challenger is not None
        else repr(score) == repr(published) and y_pred == prediction.get("y_pred"),
        "reasons": [{"feature": f, "value": v, "weight": w, "contribution": c} for f, v, w, c in ranked],
        "bias": bias,
    }


def unequal(answer: dict) -> str:
    """Why an explanation is refused: the rebuilt model does not score the event as published."""
    return (
        f"version {answer['version']} of run {answer['run']} is not rebuilt: the history's model scores this event "
        f"{answer['score']!r} ({answer['y_pred']:+d}) where the prediction published {answer['published_score']!r} "
        f"({answer['published_y_pred']:+d}); a change is missing (retention, or a crash before it was acknowledged "
        "under at-least-once) or the history was altered"
    )


def text(answer: dict) -> str:
    """The explanation for a person: the decision, then every feature's part, largest first.

    >>> print(text({"id": "c-1", "source": {"topic": "points", "partition": 0, "offset": 7}, "y_pred": -1,
    ...             "y": None, "score": -1.5, "published_score": -1.5, "equal": True, "version": 3, "run": "ab12",
    ...             "seen": 8, "reasons": [{"feature": "debt", "value": 2.0, "weight": -1.0, "contribution": -2.0}],
    ...             "bias": 0.5}))
    event c-1 (points[0] offset 7): decision -1, score -1.5
    model version 3 of run ab12, its event 8: rebuilt from the model history, the published score to the last bit
    feature  value  weight  contribution
    debt       2.0    -1.0          -2.0
    bias                             0.5
    """
    source = answer["source"] or {}
    label = "" if answer["y"] is None else f", label {answer['y']}"
    if answer.get("challenger") is not None:
        same = "a challenger publishes no score to check it against"
        whose = f"challenger {answer['challenger']}'s model, its version {answer['version']},"
    else:
        same = (
            "the published score to the last bit"
            if answer["equal"]
            else f"NOT the published score {answer['published_score']!r}"
        )
        whose = f"model version {answer['version']}"
    lines = [
        f"event {answer['id']} ({source.get('topic')}[{source.get('partition')}] offset {source.get('offset')}): "
        f"decision {answer['y_pred']}, score {answer['score']!r}{label}",
        f"{whose} of run {answer['run']}, its event {answer['seen']}: rebuilt from the model history, {same}",
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


def read_history(settings, topic: str, key: bytes, timeout_s: float) -> tuple[list[dict], list[str]]:
    """Every committed record of ``topic`` keyed ``key``, decoded (with --checkpoint-key: signed with it as ``key``'s),
    and why each that did not read was left out (a rebuild that needs one fails, naming its run)."""
    from perceptron_stream.kafka import read_partition
    from perceptron_stream.kafka.admin import partition_counts

    partitions = partition_counts(settings, [topic])[topic]
    if not partitions:
        raise ExplainError(f"topic {topic} does not exist")
    records, unread, signed_by = [], [], signing_key(settings)
    for partition in range(partitions):
        for _, record_key, value in read_partition(settings, topic, partition, None, timeout_s):
            if record_key == key and value is not None:
                try:
                    records.append(decode_record(value, key, signed_by))
                except HistoryError as exc:
                    unread.append(str(exc))
    return records, unread


def left_out(prog: str, key: bytes, unread: list[str]) -> None:
    """Say on stderr how many records of ``key``'s history were left out, and why (the first reason)."""
    if unread:
        print(
            f"{prog}: {len(unread)} record(s) of {key.decode()} in the history do not read ({unread[0]}); left out",
            file=sys.stderr,
        )


def run_explain(settings: ExplainSettings) -> int:
    """Read the prediction, its event and its task's history; print the explanation (exit 0 when the rebuilt
    score is the published one), or why not (exit 1)."""
    from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable, read_partition
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
        wanted = (
            history_key(settings.group_id, task_of(prediction))
            if settings.challenger is None
            else challenger_key(settings.group_id, task_of(prediction), settings.challenger)
        )
        records, unread = read_history(settings, settings.model_history_topic, wanted, timeout)
        left_out(PROG, wanted, unread)
        if not records and settings.challenger is not None:
            raise ExplainError(
                f"the history holds no record of challenger {settings.challenger} ({wanted.decode()}): was the "
                "service run with --history-challengers, and is the name one of its --challengers?"
            )
        answer = explain_prediction(prediction, event or b"", key, records, settings.challenger)
    except (ExplainError, KafkaFatal, KafkaUnavailable) as exc:
        print(f"{PROG}: {settings.prediction}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if settings.as_json else text(answer))
    if answer["equal"] is False:
        print(f"{PROG}: {settings.prediction}: {unequal(answer)}", file=sys.stderr)
        return 1
    return 0


def run_model_at(settings: ModelAtSettings) -> int:
    """``model at VERSION``: the version rebuilt from the history, written as a model file (exit 0), or why not (1)."""
    from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable
    from perceptron_stream.learning import model_file
    from perceptron_stream.runtime.outage import Outage

    prog = "perceptron-stream model at"
    Outage(settings.bootstrap_servers).hush()
    key = (
        history_key(settings.group_id, settings.task)
        if settings.challenger is None
        else challenger_key(settings.group_id, settings.task, settings.challenger)
    )
    try:
        records, unread = read_history(settings, settings.model_history_topic, key, settings.timeout_seconds)
        left_out(prog, key, unread)
        runs = runs_at(records, settings.version)
        run = settings.run if settings.run is not None else (runs[-1] if runs else None)
        if run is None:
            raise ExplainError(f"no run of {key.decode()} in {settings.model_history_topic} reached it")
        learner = rebuild(records, run, version=settings.version)
        meta = next((r.get("meta") for r in records if r.get("run") == run and r["kind"] == "state"), None)
        if not isinstance(meta, dict) or "variant" not in meta:
            raise ExplainError(f"run {run}'s states carry no settings (meta) to write a model file with")
    except (ExplainError, HistoryError, KafkaFatal, KafkaUnavailable) as exc:
        print(f"{prog}: version {settings.version}: {exc}", file=sys.stderr)
        return 1
    doc = model_file.from_learner(
        learner, f"model at version {settings.version} of run {run} of {key.decode()} (model history)", meta
    )
    settings.output.write_text(json.dumps(doc, indent=2) + "\n")
    also = [r for r in runs if r != run]
    note = f" (also in run(s) {', '.join(also)}: --run picks one)" if also else ""
    print(f"wrote version {settings.version} of run {run} to {settings.output}{note}", file=sys.stderr)
    return 0
