"""The command line without a broker: train over files, produce's checks before it connects.

The commands against a broker (produce, broker) are tests/integration/test_cli_commands.py's.
"""

import json
import math
import subprocess
import sys

import pytest
from perceptron_stream.cli import main

from tests.support import ROOT, SEED_003
from tests.support.launch import run_command


def _augmented_margin(report, X, Y):
    """γ as the report defines it: min_i y_i (w·x_i + b) / ||(b, w)||, computed here from scratch."""
    w, b = report["weights"], report["bias"]
    return min(y * (sum(wi * xi for wi, xi in zip(w, x)) + b) for x, y in zip(X, Y)) / math.sqrt(
        b * b + sum(v * v for v in w)
    )


def test_train_reproduces_seed_003_from_csv(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text(SEED_003)
    assert main(["train", "--data", str(data)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["weights"], report["bias"], report["updates"], report["converged"]) == ([-1.0, 1.0], 0.0, 2, True)
    assert report["passes"] == 2  # the second pass makes no mistake
    assert report["radius"] == math.sqrt(26)  # ||(1, 3, 4)||
    assert report["training_mistakes"] == 0 and report["margin"] == pytest.approx(1 / math.sqrt(2))
    X, Y = [[1, 2], [2, 4], [3, 4], [2, 1], [4, 2]], [1, 1, 1, -1, -1]
    assert report["bound"] == pytest.approx((math.sqrt(26) / _augmented_margin(report, X, Y)) ** 2) == 52.0


def test_train_bound_uses_the_margin_with_the_bias(tmp_path, capsys):
    """Seed 002's offset example: b = 7 ≠ 0, so (R/margin)² would be wrong (153 vs 986)."""
    data = tmp_path / "d.jsonl"
    X, Y = [[1.0], [2.0], [3.0], [4.0]], [1, 1, -1, -1]
    data.write_text("".join(json.dumps({"x": x, "y": y}) + "\n" for x, y in zip(X, Y)))
    assert main(["train", "--data", str(data)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["weights"], report["bias"], report["converged"], report["training_mistakes"]) == (
        [-3.0],
        7.0,
        True,
        0,
    )
    assert report["radius"] == math.sqrt(17) and report["margin"] == pytest.approx(1 / 3)
    assert report["updates"] == 25 and report["passes"] == 11  # cyclic PLA: the 11th pass is clean
    assert report["bound"] == pytest.approx((report["radius"] / _augmented_margin(report, X, Y)) ** 2) == 17 * 58
    assert report["updates"] <= report["bound"]


def test_train_bound_when_the_bias_alone_separates(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("x1,y\n0,1\n0,1\n")
    assert main(["train", "--data", str(data)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["weights"], report["bias"], report["training_mistakes"], report["passes"]) == ([0.0], 1.0, 0, 2)
    assert report["margin"] is None and report["radius"] == 1.0 and report["bound"] == 1.0


def test_train_reads_the_wire_format_and_pocket_on_non_separable_data(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    # the offset example of seed 002, plus one flipped label: not separable any more
    rows = [
        {"x": [1.0], "y": 1},
        {"x": [2.0], "y": 1},
        {"x": [3.0], "y": -1},
        {"x": [4.0], "y": -1},
        {"x": [1.5], "y": -1},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--algorithm",
                "pocket",
                "--order",
                "random",
                "--seed",
                "3",
                "--max-passes",
                "50",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["converged"] is False and report["bound"] is None
    assert report["training_mistakes"] == 1  # the best a line can do here
    assert report["margin"] < 0
    assert report["passes"] == 50  # pocket never stops early on non-separable data
    assert report["radius"] == math.sqrt(17)  # ||(1, 4)||


def test_train_names_a_bad_data_file(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"x": [1.0]}\n')
    assert main(["train", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "invalid setting data (--data)" in err and "has no label" in err


@pytest.mark.parametrize("second", ['{"features": {"x0": 1.0}, "y": 1}', '{"x": [1.0, 2.0], "y": 1}'])
def test_train_rejects_a_jsonl_file_mixing_forms(tmp_path, capsys, second):
    """x and features events (or x of other lengths) would be lined up by position: refused,
    naming the first offending line (line numbers count blank lines too)."""
    data = tmp_path / "mixed.jsonl"
    data.write_text('{"x": [1.0], "y": 1}\n\n{"x": [2.0], "y": -1}\n' + second + '\n{"x": [3.0], "y": 1}\n')
    assert main(["train", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:4:" in err and "(line 1)" in err


def test_train_rejects_features_then_x(tmp_path, capsys):
    data = tmp_path / "mixed.jsonl"
    data.write_text('{"features": {"a": 1.0}, "y": 1}\n{"x": [2.0], "y": -1}\n')
    assert main(["train", "--data", str(data)]) == 2
    assert f"{data}:2: the event has 'x' but the first event (line 1) has 'features'" in capsys.readouterr().err


@pytest.mark.parametrize("label", ["0.5", "1.9", "-0.5", "2", "1.0", "yes", "nan"])
def test_train_rejects_a_csv_label_that_is_not_one(tmp_path, capsys, label):
    """int(float(label)) made 0.5 a -1 and 1.9 a +1: only the wire format's spellings pass."""
    data = tmp_path / "d.csv"
    data.write_text(f"x1,y\n1,1\n2,{label}\n3,-1\n")
    assert main(["train", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:3:" in err and repr(label) in err


def test_train_takes_the_wire_label_spellings_in_csv(tmp_path):
    from perceptron_stream.streams import load_dataset

    data = tmp_path / "d.csv"
    data.write_text("x1,y\n1,1\n2,+1\n3,true\n4,TRUE\n5,-1\n6,0\n7,false\n8, False \n")
    X, y, names, form = load_dataset(data)
    assert (X, y, names, form) == ([[float(i)] for i in range(1, 9)], [1, 1, 1, 1, -1, -1, -1, -1], ["x1"], "named")
    assert main(["train", "--data", str(data)]) == 0


@pytest.mark.parametrize("value", ["1.0", "1.2", "-0.1", "nan"])
def test_produce_refuses_a_margin_the_unit_ball_cannot_hold(capsys, value):
    """--margin 1.2 made the separable stream loop forever: refused before anything connects."""
    assert main(["produce", "--margin", value]) == 2
    assert "invalid setting margin (--margin, PERCEPTRON_STREAM_MARGIN)" in capsys.readouterr().err


def test_produce_without_a_broker_names_bootstrap_servers(monkeypatch, capsys, signal_handlers):
    from perceptron_stream import produce
    from perceptron_stream.broker import free_port

    monkeypatch.setattr(produce, "CONNECT_TIMEOUT_S", 0.0)  # one attempt, not the 15 s a starting broker gets
    assert main(["produce", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--no-progress"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("perceptron-stream produce: cannot use the brokers at 127.0.0.1:")
    assert "(--bootstrap-servers)" in last and "nothing was written" in last


# -- serve's bad settings exit 2, whichever check finds them (docs/reference/cli.md) --------------------------------


@pytest.mark.parametrize("store", ["local", "none"])
def test_serve_exactly_once_without_the_kafka_store_exits_2_before_connecting(capsys, store, tmp_path):
    from perceptron_stream.broker import free_port

    # no broker listens at the bootstrap servers: the refusal comes from the settings alone
    code = main(
        [
            "serve",
            "--processing-guarantee",
            "exactly-once",
            "--state-store",
            store,
            "--state-dir",
            str(tmp_path),
            "--bootstrap-servers",
            f"127.0.0.1:{free_port()}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--processing-guarantee exactly-once needs --state-store kafka (it is {store})" in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "the model file holds an averaged perceptron, and --variant is plain"),
        (["--variant", "averaged", "--standardize"], "no scaler in front, and --standardize is on"),
        (["--variant", "averaged", "--max-model-features", "1"], "more than --max-model-features 1"),
    ],
)
def test_serve_with_an_initial_model_that_does_not_fit_exits_2_naming_it(capsys, tmp_path, flags, said):
    from perceptron_stream.broker import free_port
    from perceptron_stream.learning import Perceptron, model_file

    learner = Perceptron("averaged")
    learner.step([1.0, 2.0], 1)
    path = tmp_path / "model.json"
    meta = {"variant": "averaged", "margin": 0.0, "standardize": False, "hash_features": 0}
    path.write_text(json.dumps(model_file.from_learner(learner, "a test", meta)))
    code = main(["serve", "--initial-model", str(path), "--bootstrap-servers", f"127.0.0.1:{free_port()}", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"initial_model {path} (--initial-model) does not fit" in err and said in err


def test_an_initial_model_larger_than_its_feature_cap_allows_is_refused_before_it_is_read(capsys, tmp_path):
    """A 10-million-feature file was parsed whole (7.8 s, 2.3 GB) before its feature count refused it: its size is
    checked first. The file here is not even JSON past its first bytes, so a refusal for its size is one that did
    not parse it."""
    from perceptron_stream.broker import free_port
    from perceptron_stream.learning.model_file import largest_file_bytes

    path = tmp_path / "huge.json"
    largest = largest_file_bytes(10)
    assert largest is not None
    path.write_bytes(b'{"kind": ' + b" " * largest)
    flags = ["--max-model-features", "10", "--bootstrap-servers", f"127.0.0.1:{free_port()}"]
    code = main(["serve", "--initial-model", str(path), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"does not fit: {largest + 9:,} bytes, more than a model file of --max-model-features 10 features" in err
    path.write_bytes(b'{"kind": ')  # small: read, and refused as no model file
    code = main(["serve", "--initial-model", str(path), "--bootstrap-servers", f"127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    assert code == 2 and f"initial_model {path} is not a model file" in err, err


def test_produce_without_a_broker_says_so_in_one_line():
    """kafka-python's own ERROR and WARNING lines came first, its "Unable to bootstrap" four times."""
    from perceptron_stream.broker import free_port

    one_attempt = (  # not the 15 s a starting broker gets
        "import sys; from perceptron_stream import produce, cli; produce.CONNECT_TIMEOUT_S = 0.0; "
        "sys.exit(cli.main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", one_attempt, "produce", "--bootstrap-servers", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("perceptron-stream produce: cannot use the brokers at 127.0.0.1:")


def test_model_export_without_a_broker_says_so_in_one_line(tmp_path):
    from perceptron_stream.broker import free_port

    done = run_command(
        "model", "export", "--output", str(tmp_path / "m.json"), "--state-store", "kafka",
        "--bootstrap-servers", f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("perceptron-stream model export: cannot read topic perceptron-stream.checkpoints: ")


def test_model_export_without_a_checkpoint_names_the_task_it_looked_for_and_the_other_scope(tmp_path, capsys):
    """A partition-scope model keeps one checkpoint per partition: "no checkpoint of model" alone left the reader
    guessing that --task exists."""
    export = ["model", "export", "--output", str(tmp_path / "m.json"), "--state-dir", str(tmp_path), "--group-id", "g"]
    assert main(export) == 1
    said = capsys.readouterr().err
    assert said.startswith(
        f"perceptron-stream model export: no checkpoint of --task model of group g in the local store ({tmp_path})"
    )
    assert (
        "a model of --model-scope partition keeps one checkpoint per partition: name one with --task partition-N"
        in said
    )
    assert main([*export, "--task", "partition-2"]) == 1
    said = capsys.readouterr().err
    assert "no checkpoint of --task partition-2 of group g" in said and "--model-scope group is --task model" in said
    assert not (tmp_path / "m.json").exists()


def test_a_refused_start_says_its_error_once(tmp_path):
    """serve logged a refusal and printed it too, both on stderr: the same error twice, one under the other."""
    offline = ["--bootstrap-servers", "127.0.0.1:1", "--metrics-port", "0", "--state-dir", str(tmp_path)]
    refused = subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", "serve", "--processing-guarantee", "exactly-once", *offline],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert refused.returncode != 0 and "needs --state-store kafka" in refused.stderr, refused.stderr
    assert refused.stderr.count("needs --state-store kafka") == 1, refused.stderr


def test_a_second_instance_on_a_taken_metrics_port_stops_with_one_line_naming_it(tmp_path):
    """Two `serve` on one host with the default --metrics-port: the second says so in one line and exits 1.

    Exit 1, not 2: the port is a valid setting that another process holds (a second instance, or the previous one
    still stopping), as a state directory another instance holds is (exit 1); the same command works once it is
    free. The first instance waits for brokers that do not answer, its endpoints up all the while."""
    from tests.support.endpoints import http_get
    from tests.support.launch import start_service_process
    from tests.support.prometheus_server import free_port
    from tests.support.service import stop_process, tail
    from tests.support.waiting import wait_until

    port = free_port()
    args = ["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--metrics-port", str(port)]
    first = start_service_process([*args, "--state-dir", str(tmp_path / "a")], tmp_path / "first.log")
    try:
        wait_until(
            lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] != 0 or first.poll() is not None,
            60,
            what="the first instance's endpoints",
        )
        assert first.poll() is None, tail(tmp_path / "first.log")
        second = start_service_process([*args, "--state-dir", str(tmp_path / "b")], tmp_path / "second.log")
        assert second.wait(60) == 1, tail(tmp_path / "second.log")
        lines = (tmp_path / "second.log").read_text().splitlines()
        assert lines == [
            f"perceptron-stream serve: cannot serve /metrics, /healthz, /readyz and /model: --metrics-port {port}: "
            f"127.0.0.1:{port} is in use by another process (each instance on one host needs a --metrics-port of its "
            "own; 0 picks a free one)"
        ], lines
        assert first.poll() is None, tail(tmp_path / "first.log")  # the first one goes on
    finally:
        stop_process(first, tmp_path / "first.log")


@pytest.mark.parametrize("where", ["weights", "state's scaler"])
def test_an_initial_model_beyond_the_read_back_bounds_exits_2_naming_it(capsys, tmp_path, where):
    """Measured on f27e9e1: a model file of 1e308 weights started, and 20 of 20 scores were null. A scaler's mean
    of 1e200 in a file's state is refused alike (a mix pooling it overflowed)."""
    from perceptron_stream.broker import free_port
    from perceptron_stream.learning import make_learner, model_file

    flags = []
    if where == "weights":
        doc = model_file.from_weights({"a": 1e308, "b": 1e308}, bias=0.0, source="a forger")
    else:
        learner = make_learner(standardize=True)
        learner.step({"a": 1.0}, 1)
        meta = {"variant": "plain", "margin": 0.0, "standardize": True, "hash_features": 0}
        doc = model_file.from_learner(learner, "a forger", meta)
        doc["state"]["scaler"]["means"][0][1] = 1e200
        flags = ["--standardize"]
    path = tmp_path / "model.json"
    path.write_text(json.dumps(doc))
    code = main(["serve", "--initial-model", str(path), "--bootstrap-servers", f"127.0.0.1:{free_port()}", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"initial_model {path} (--initial-model) does not fit" in err and "magnitude at most" in err, err


def test_model_export_skips_a_newest_checkpoint_it_cannot_rebuild_for_the_older_one(tmp_path, capsys):
    """A forged newest checkpoint (1e200 weights, checksummed) made ``model export`` exit 1 with a ValueError, where a
    restore tries the next older one: the export takes the older, as the service would."""
    from perceptron_stream.config import ServeSettings, load
    from perceptron_stream.learning import make_learner
    from perceptron_stream.runtime.factory import model_meta
    from perceptron_stream.state.checkpoint import GROUP_TASK, Checkpoint, Owner, encode_checkpoint
    from perceptron_stream.state.local import LocalStore

    from tests.support.checkpoints import resealed

    s = load(ServeSettings, ["--metrics-port", "0", "--state-dir", str(tmp_path), "--group-id", "g"])
    owner = Owner(s.group_id, s.input_topic, GROUP_TASK)
    learner = make_learner(max_features=s.max_model_features)
    learner.step([1.0, 2.0], 1)
    store = LocalStore(s.state_dir, s.group_id)
    store.save(Checkpoint(1, {(s.input_topic, 0): 1}, learner.to_state(), 1, model_meta(s), 0.0, owner))
    forged = json.loads(
        encode_checkpoint(Checkpoint(2, {(s.input_topic, 0): 2}, learner.to_state(), 2, model_meta(s), 0.0, owner))
    )
    forged["model"].update(weights=[1e200, 1.0])
    (store.task_dir(GROUP_TASK) / "checkpoint-000000000002.json").write_bytes(resealed(forged))
    store.close()
    out = tmp_path / "m.json"
    assert main(["model", "export", "--output", str(out), "--state-dir", str(tmp_path), "--group-id", "g"]) == 0
    assert "wrote checkpoint 1 of model" in capsys.readouterr().err
    assert json.loads(out.read_text())["state"] == learner.to_state()
