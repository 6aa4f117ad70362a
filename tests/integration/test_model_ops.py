"""Model operations on the embedded broker: challengers, drift, GET /model, warm start and frozen learning."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from perceptron_stream.learning import make_learner
from perceptron_stream.streams import separable

from tests.support import ROOT
from tests.support.endpoints import http_get, metrics_once
from tests.support.launch import run_command, settings_args
from tests.support.service import final_checkpoint
from tests.support.topics import consume, create_topic, produce
from tests.support.waiting import wait_until

CHALLENGERS = {"averaged": ("averaged", 0.0), "pocket": ("pocket", 0.0), "margin:0.5": ("margin", 0.5)}


def _events(count: int, seed: int, flip_after: int | None = None, noise: float = 0.0) -> list[dict]:
    out = []
    for i, (e, _) in enumerate(zip(separable(dimensions=5, margin=0.1, noise=noise, seed=seed), range(count))):
        y = -e["y"] if flip_after is not None and i >= flip_after else e["y"]
        out.append({"id": e["id"], "x": e["x"], "y": y})
    return out


def _metric(url: str, name: str) -> float:
    return _value(metrics_once(url, f"\n{name} "), name)  # once the page is served with it


def _value(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not exported")


def test_challengers_are_scored_on_the_champions_events_and_only_the_champion_publishes(
    broker, topics, tmp_path, service_thread
):
    events = [*_events(3000, seed=81), {"id": "u", "x": [0.1] * 5}]  # and one unlabeled
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    args = settings_args(broker, topics, tmp_path, challengers="averaged,pocket,margin:0.5")
    service = service_thread(args)
    predictions = [json.loads(m.value) for m in consume(broker.bootstrap_servers, topics["output_topic"], len(events))]
    champion = make_learner(max_features=50_000)
    challengers = {n: make_learner(v, m, max_features=50_000) for n, (v, m) in CHALLENGERS.items()}
    for e, p in zip(events, predictions):
        assert (p["y_pred"], p["score"]) == champion.step(e["x"], e.get("y"))[:2]  # the champion's, no other
        for c in challengers.values():
            c.step(e["x"], e.get("y"))
    counted = [
        f'perceptron_challenger_mistakes_total{{challenger="{name}"}} {float(c.mistakes)}'
        for name, c in challengers.items()
    ]
    metrics = metrics_once(service.metrics_url, *counted)  # the last batch is counted after its outputs
    assert all(line in metrics for line in counted), metrics
    for name in challengers:
        assert 0.0 <= _value(metrics, f'perceptron_challenger_mistake_rate{{challenger="{name}"}}') <= 1.0
    report = json.loads(http_get(service.metrics_url + "/model")[1])
    [model] = report["models"]
    assert model["champion"]["weights"] == {str(k): v for k, v in champion.weights.items()}
    assert model["champion"]["bias"] == champion.bias and model["champion"]["version"] == champion.updates
    assert model["challengers"]["averaged"]["weights"] == {
        str(k): v for k, v in challengers["averaged"].weights.items()
    }
    assert http_get(service.metrics_url + "/model")[0] == 200
    service.stop()
    checkpoint = final_checkpoint(args, "local")  # checkpointed with the champion, restored with it
    assert checkpoint.task["challengers"] == {n: c.to_state() for n, c in challengers.items()}
    assert checkpoint.model == champion.to_state()


def test_a_rule_change_after_5000_stable_events_is_one_drift_after_it_and_none_before(
    broker, topics, tmp_path, service_thread
):
    # 2% label noise: the plain perceptron relearns unsteadily, and river's DDM alone counted 2 drifts on these
    events = _events(8000, seed=92, flip_after=5000, noise=0.02)
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    produce(broker.bootstrap_servers, topics["input_topic"], events[:5000])
    service = service_thread(settings_args(broker, topics, tmp_path))
    consume(broker.bootstrap_servers, topics["output_topic"], 5000)
    counted = 'perceptron_events_total{kind="labeled"} 5000.0'
    metrics = metrics_once(service.metrics_url, counted)
    assert counted in metrics and _value(metrics, "perceptron_drift_detected_total") == 0
    assert _value(metrics, "perceptron_last_drift_timestamp_seconds") == 0
    produce(broker.bootstrap_servers, topics["input_topic"], events[5000:])
    consume(broker.bootstrap_servers, topics["output_topic"], 8000)
    metrics = metrics_once(
        service.metrics_url, 'perceptron_events_total{kind="labeled"} 8000.0', "perceptron_drift_detected_total 1.0"
    )
    assert _value(metrics, "perceptron_drift_detected_total") == 1  # one change, one drift
    assert _value(metrics, "perceptron_last_drift_timestamp_seconds") > 1.7e9
    service.stop()


def test_train_output_served_frozen_predicts_exactly_the_trained_weights(broker, topics, tmp_path, service_thread):
    events = _events(400, seed=83)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events[:200]))
    model = tmp_path / "model.json"
    subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", "train", "--data", str(data), "--output", str(model)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    doc = json.loads(model.read_text())
    assert doc["kind"] == "perceptron-stream.model" and doc["features"] == [0, 1, 2, 3, 4]  # dense x: features 0..d-1
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    produce(broker.bootstrap_servers, topics["input_topic"], events[200:])
    service = service_thread(settings_args(broker, topics, tmp_path, initial_model=str(model), learning="off"))
    predictions = [json.loads(m.value) for m in consume(broker.bootstrap_servers, topics["output_topic"], 200)]
    for e, p in zip(events[200:], predictions):
        score = sum(w * x for w, x in zip(doc["weights"], e["x"])) + doc["bias"]
        assert p["score"] == pytest.approx(score, abs=1e-12) and p["y_pred"] == (1 if score > 0 else -1)
        assert p["model"]["version"] == 0 and p["mistake"] == (e["y"] * score <= 0)
    assert [p["model"]["seen"] for p in predictions] == list(range(1, 201))
    mistakes = f"perceptron_mistakes_total {float(sum(p['mistake'] for p in predictions))}"
    metrics = metrics_once(service.metrics_url, 'perceptron_events_total{kind="labeled"} 200.0', mistakes)
    assert mistakes in metrics and _value(metrics, "perceptron_updates_total") == 0
    service.stop()


def test_model_export_writes_what_serve_starts_from(broker, topics, tmp_path, service_thread, caplog):
    events = _events(500, seed=84)
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    args = settings_args(broker, topics, tmp_path, variant="averaged")
    service = service_thread(args)
    consume(broker.bootstrap_servers, topics["output_topic"], 500)
    service.stop()
    out = tmp_path / "exported.json"
    done = run_command(
        "model", "export", "--output", str(out), "--state-dir", str(tmp_path / "state"),
        "--group-id", topics["group_id"], "--input-topic", topics["input_topic"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["state"] == final_checkpoint(args, "local").model and doc["variant"] == "averaged"
    # served elsewhere, as a new model: it starts where the export left off
    other = {**topics, "group_id": topics["group_id"] + "-b", "output_topic": topics["output_topic"] + "-b"}
    caplog.set_level(logging.INFO, logger="perceptron_stream")
    again = service_thread(settings_args(broker, other, tmp_path / "b", variant="averaged", initial_model=str(out)))
    first = json.loads(consume(broker.bootstrap_servers, other["output_topic"], 1)[0].value)
    assert first["model"]["seen"] == 501  # the exported counters, then this event
    # what the log says it starts from, once and true (it said "starting from zero weights" first)
    said = [r.getMessage() for r in caplog.records if r.name == "perceptron_stream"]
    assert "no checkpoint yet of model: a new model" in said and not [line for line in said if "zero weights" in line]
    assert len([line for line in said if line.startswith(f"model starts from --initial-model {out}")]) == 1, said
    again.stop()
    fresh = {**other, "group_id": topics["group_id"] + "-c"}
    refused = run_command("serve", *settings_args(broker, fresh, tmp_path / "c"), "--initial-model", str(out))
    assert refused.returncode == 2, refused.stderr  # a bad setting (docs/reference/cli.md), before connecting
    assert "initial_model" in refused.stderr and "(--initial-model)" in refused.stderr
    assert "the model file holds an averaged perceptron, and --variant is plain" in refused.stderr


def test_in_partition_scope_model_lists_every_replica_with_its_challengers(broker, topics, tmp_path, service_thread):
    create_topic(broker.bootstrap_servers, topics["input_topic"], partitions=2)
    events = _events(600, seed=85)
    for p in range(2):
        produce(broker.bootstrap_servers, topics["input_topic"], events[p::2], partition=p)
    args = settings_args(broker, topics, tmp_path, model_scope="partition", mix_every=0, challengers="pocket")
    service = service_thread(args)
    consume(broker.bootstrap_servers, topics["output_topic"], 600)
    metrics_once(service.metrics_url, 'perceptron_events_total{kind="labeled"} 600.0')
    report = json.loads(http_get(service.metrics_url + "/model")[1])
    assert report["scope"] == "partition" and [m["partition"] for m in report["models"]] == [0, 1]
    for p, model in enumerate(report["models"]):
        champion, pocket = make_learner(max_features=50_000), make_learner("pocket", max_features=50_000)
        for e in events[p::2]:
            champion.step(e["x"], e["y"])
            pocket.step(e["x"], e["y"])
        assert model["task"] == f"partition-{p}" and model["champion"]["weights"] == {
            str(k): v for k, v in champion.weights.items()
        }
        assert model["challengers"]["pocket"]["weights"] == {str(k): v for k, v in pocket.weights.items()}
    service.stop()


def _docs_warm_start() -> list[list[str]]:
    """The warm-start example of the docs (how-to/warm-start.md), its `$ ` lines as argument lists (the printf line
    as its file's text)."""
    import re
    import shlex

    text = (ROOT / "docs" / "how-to" / "warm-start.md").read_text()
    block = text[text.index("## Warm start") :]
    block = block[block.index("```sh") + 5 : block.index("```", block.index("```sh") + 5)]
    return [
        shlex.split(re.sub(r"\s*&$", "", line.strip()[2:]))
        for line in block.splitlines()
        if line.strip().startswith("$ ")
    ]


def _cli(args: list[str], cwd, broker=None, topic=None) -> subprocess.CompletedProcess:
    assert args[0] == "perceptron-stream"
    extra = (
        [] if broker is None else ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--no-progress"]
    )
    done = subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", *args[1:], *extra],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_the_docs_warm_start_example_predicts_the_textbook_points_right(broker, topics, tmp_path, service_thread):
    """The docs' lines, run as they are: printf, train --dense, serve --initial-model --learning off, produce --dense."""
    printf, train, serve, send = _docs_warm_start()
    assert printf[:1] == ["printf"] and printf[-2:] == [">", "d.csv"]
    (tmp_path / "d.csv").write_text(printf[1].encode().decode("unicode_escape"))
    _cli(train, tmp_path)
    assert json.loads((tmp_path / "model.json").read_text())["input"] == "dense"
    assert serve[:2] == ["perceptron-stream", "serve"]
    args = [a if a != "model.json" else str(tmp_path / "model.json") for a in serve[2:]]
    flags = {"--group-id": "group_id", "--input-topic": "input_topic", "--output-topic": "output_topic"}
    args = [topics[flags[args[i - 1]]] if i and args[i - 1] in flags else a for i, a in enumerate(args)]  # the test's
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    service = service_thread(settings_args(broker, topics, tmp_path) + args)
    _cli(send, tmp_path, broker, topics["input_topic"])
    predictions = [json.loads(m.value) for m in consume(broker.bootstrap_servers, topics["output_topic"], 5)]
    assert [(p["y_pred"], p["y"], p["mistake"]) for p in predictions] == [
        (1, 1, False),
        (1, 1, False),
        (1, 1, False),
        (-1, -1, False),
        (-1, -1, False),
    ]
    assert [p["score"] for p in predictions] == [1.0, 2.0, 1.0, -1.0, -2.0]  # w = (-1, 1), b = 0 (seed 003)
    assert _metric(service.metrics_url, "perceptron_events_without_known_features_total") == 0
    service.stop()


def test_a_model_of_names_served_dense_events_shows_in_the_metric_within_a_batch_and_in_the_log(
    broker, topics, tmp_path, service_thread, caplog
):
    (tmp_path / "d.csv").write_text("x1,x2,y\n1,2,1\n2,4,1\n3,4,1\n2,1,-1\n4,2,-1\n")
    _cli(["perceptron-stream", "train", "--data", "d.csv", "--output", "model.json"], tmp_path)  # no --dense: named
    assert json.loads((tmp_path / "model.json").read_text())["input"] == "named"
    events = [
        {"x": [1, 2], "y": 1},
        {"x": [2, 4], "y": 1},
        {"x": [3, 4], "y": 1},
        {"features": {"x1": 1, "x2": 2}, "y": 1},
    ]
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    service = service_thread(
        settings_args(broker, topics, tmp_path, initial_model=str(tmp_path / "model.json"), learning="off")
    )
    predictions = [json.loads(m.value) for m in consume(broker.bootstrap_servers, topics["output_topic"], 4)]
    assert [(p["score"], p["y_pred"]) for p in predictions] == [(0.0, -1)] * 3 + [
        (1.0, 1)
    ]  # the bias alone, then named
    unknown = "perceptron_events_without_known_features_total 3.0"
    assert unknown in metrics_once(service.metrics_url, 'perceptron_events_total{kind="labeled"} 4.0', unknown)
    told = [r.getMessage() for r in caplog.records if "shares no feature with the model" in r.getMessage()]
    assert len(told) == 1 and "train the model on dense x (train --dense for a CSV)" in told[0], told
    service.stop()


def test_a_model_file_whose_features_cannot_meet_its_input_is_refused_at_start_up(broker, topics, tmp_path):
    (tmp_path / "d.csv").write_text("x1,x2,y\n1,2,1\n2,1,-1\n")
    _cli(["perceptron-stream", "train", "--data", "d.csv", "--output", "model.json"], tmp_path)
    doc = json.loads((tmp_path / "model.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**doc, "input": "dense"}))  # says dense, holds names
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "perceptron_stream.cli",
            "serve",
            *settings_args(broker, topics, tmp_path),
            "--initial-model",
            str(tmp_path / "bad.json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr  # a bad setting: the file it names (docs/reference/cli.md)
    assert (
        f"initial_model {tmp_path / 'bad.json'} (--initial-model) does not fit: the model file says its features "
        "come from dense x" in refused.stderr
    )


def _poll_model(url: str, stop, got: list, offset: int = 0) -> None:
    """One client asking for /model in a loop until ``stop`` is set: the reports it got appended to ``got``."""
    while not stop.is_set():
        status, body = http_get(f"{url}/model?offset={offset}")
        if status == 200:
            got.append(json.loads(body))


@pytest.mark.parametrize("learning", ["off", "on"])
def test_eight_clients_polling_model_of_a_wide_model_cost_one_build_per_version(
    broker, topics, tmp_path, service_thread, learning
):
    """A 50,000-feature model, a backlog of 10-feature events, 8 clients asking for /model all along: every event is
    predicted, and the weights were copied once per model version the clients saw (learning off: once), however many
    reports they got; the pages together are the model's weights, each feature once. (The events/s: bench/e2e.py.)"""
    import threading

    width = 50_000
    weights = {f"feature-{i:05d}": round(0.001 * ((i * 7919) % 2001 - 1000), 3) for i in range(width)}
    model = tmp_path / "wide.json"
    model.write_text(
        json.dumps(
            {
                "kind": "perceptron-stream.model",
                "format": 1,
                "variant": "plain",
                "input": "named",
                "features": list(weights),
                "weights": list(weights.values()),
                "bias": 0.0,
                "source": "test",
            }
        )
    )
    events = [
        {"id": i, "features": {f"feature-{(i * 13 + j) % width:05d}": 1.0 for j in range(10)}, "y": 1 if i % 3 else -1}
        for i in range(3000)
    ]
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    service = service_thread(settings_args(broker, topics, tmp_path, initial_model=str(model), learning=learning))

    def started():
        status, body = http_get(service.metrics_url + "/model")
        return status == 200 and json.loads(body)["models"][0]["champion"]["features"] == width

    wait_until(started, 30, what="/model shows the initial model")
    before = (
        service.app.reports.builds
    )  # a request before start-up saw the placeholder model: another model, another build
    stop = threading.Event()
    got: list[list] = [[] for _ in range(8)]
    clients = [
        threading.Thread(target=_poll_model, args=(service.metrics_url, stop, got[i], 1000 * i), daemon=True)
        for i in range(8)
    ]
    for c in clients:
        c.start()
    try:
        assert len(consume(broker.bootstrap_servers, topics["output_topic"], 3000)) == 3000
    finally:
        stop.set()
        for c in clients:
            c.join(30)
    reports = [r for client in got for r in client]
    assert len(reports) >= 8 and all(client for client in got)  # every client was answered, some many times
    seen_versions = {r["models"][0]["champion"]["weights_version"] for r in reports}
    builds = service.app.reports.builds - before
    if learning == "off":
        assert seen_versions == {0} and builds == 0  # the copy the start-up request took served them all
    else:
        assert builds <= len(seen_versions)  # one build per version a request saw first; every other reused it
    # the pages walk the whole model, in its order, each feature once (learning off: the file's weights)
    walked: dict[str, float] = {}
    offset: int | None = 0
    while offset is not None:
        page = json.loads(http_get(f"{service.metrics_url}/model?offset={offset}&limit=10000")[1])
        champion = page["models"][0]["champion"]
        assert champion["features"] == len(walked) + len(champion["weights"]) + max(
            0, champion["features"] - offset - 10000
        )
        walked.update(champion["weights"])
        offset = page["next_offset"]
    assert len(walked) == width and (learning == "on" or walked == weights)
    service.stop()
