"""Settings: flags, environment, file; bad values fail naming the setting."""

import json
import subprocess
import sys

import pytest
from perceptron_stream.config import ConfigError, ProduceSettings, ServeSettings, load


def test_flags_override_env_which_override_the_file(tmp_path, monkeypatch):
    config = tmp_path / "serve.toml"
    config.write_text('input_topic = "from-file"\noutput_topic = "out-file"\nbatch_size = 7\n')
    monkeypatch.setenv("PERCEPTRON_STREAM_OUTPUT_TOPIC", "out-env")
    s = load(ServeSettings, ["--config-file", str(config), "--batch-size", "9"])
    assert (s.input_topic, s.output_topic, s.batch_size) == ("from-file", "out-env", 9)


def test_json_config_file_and_env_var_for_the_file(tmp_path, monkeypatch):
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"group_id": "g-json", "variant": "pocket"}))
    monkeypatch.setenv("PERCEPTRON_STREAM_CONFIG_FILE", str(config))
    s = load(ServeSettings, [])
    assert (s.group_id, s.variant) == ("g-json", "pocket")


@pytest.mark.parametrize(
    "args, env, named",
    [
        (["--batch-size", "0"], {}, "batch_size (--batch-size, PERCEPTRON_STREAM_BATCH_SIZE)"),
        (["--variant", "deep"], {}, "invalid setting variant"),
        (["--metrics-port", "70000"], {}, "invalid setting metrics_port"),
        (["--margin", "nan"], {}, "invalid setting margin"),
        ([], {"PERCEPTRON_STREAM_AUTO_OFFSET_RESET": "middle"}, "invalid setting auto_offset_reset"),
        (["--security-protocol", "SASL_SSL"], {}, "sasl_mechanism must be set"),
        (["--security-protocol", "SASL_SSL", "--sasl-mechanism", "PLAIN"], {}, "sasl_username and sasl_password"),
        (["--security-protocol", "SASL_SSL", "--sasl-mechanism", "OAUTHBEARER"], {}, "invalid setting sasl_mechanism"),
        (["--ssl-cafile", "/nonexistent/ca.pem"], {}, "ssl_cafile /nonexistent/ca.pem is not a readable file"),
        (["--output-topic", "points"], {}, "three different topics"),
        (["--margin", "0.5"], {}, "margin 0.5 is only used by variant margin"),
        (["--no-such-flag", "1"], {}, "unrecognized arguments: --no-such-flag"),
        (
            ["--max-model-features", "-1"],
            {},
            "invalid setting max_model_features (--max-model-features, PERCEPTRON_STREAM_MAX_MODEL_FEATURES)",
        ),
        (
            ["--hash-features", "-1"],
            {},
            "invalid setting hash_features (--hash-features, PERCEPTRON_STREAM_HASH_FEATURES)",
        ),
        (
            ["--hash-features", "1024"],
            {"PERCEPTRON_STREAM_MAX_MODEL_FEATURES": "1000"},
            "hash_features 1024 is more than max_model_features 1000",
        ),
        (["--group-protocol", "consumer"], {}, "group_protocol consumer (KIP-848) needs --kafka-client confluent"),
        (["--group-protocol", "eager"], {}, "invalid setting group_protocol"),
        (["--commit-interval-ms", "60000"], {}, "invalid setting commit_interval_ms (--commit-interval-ms"),
        (
            ["--bootstrap-servers", "127.0.0.1"],
            {},
            "invalid setting bootstrap_servers (--bootstrap-servers, PERCEPTRON_STREAM_BOOTSTRAP_SERVERS): "
            "'127.0.0.1' has no port: give every server as host:port (e.g. 127.0.0.1:9092)",
        ),
        (["--bootstrap-servers", "a:9092,b:x"], {}, "'b:x' is not host:port with a port from 1 to 65535"),
        (["--history-challengers", "--challengers", "averaged"], {}, "history_challengers needs --model-history-topic"),
        (
            ["--history-challengers", "--model-history-topic", "h"],
            {},
            "history_challengers needs --model-history-topic",
        ),
    ],
)
def test_bad_values_name_the_setting(args, env, named, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as error:
        load(ServeSettings, args)
    assert named in str(error.value)


def test_early_labels_that_would_pause_a_label_partition_at_one_are_refused():
    """--max-early-labels at or under --batch-size: the gate's pause point was 1, one early label paused the partition."""
    with pytest.raises(ConfigError) as error:
        load(ServeSettings, ["--label-topic", "labels", "--max-early-labels", "10", "--batch-size", "10"])
    assert "max_early_labels 10 is not more than batch_size 10" in str(error.value)
    assert load(ServeSettings, ["--label-topic", "labels", "--max-early-labels", "11", "--batch-size", "10"])
    assert load(ServeSettings, ["--max-early-labels", "10", "--batch-size", "10"])  # no delayed labels: no gate


def test_a_clock_skew_not_less_than_the_grace_is_refused():
    """One point stamped --max-clock-skew-seconds ahead moves the grace clock that far: at or past the grace, every
    label waiting would go as it came."""
    with pytest.raises(ConfigError) as error:
        load(
            ServeSettings, ["--label-topic", "labels", "--label-grace-seconds", "30", "--max-clock-skew-seconds", "60"]
        )
    assert "max_clock_skew_seconds 60 is not less than label_grace_seconds 30" in str(error.value)
    # left to its default, the skew is 60 s or half a grace under 120 s: a grace valid before the bound stays valid
    assert load(ServeSettings, ["--label-topic", "labels", "--label-grace-seconds", "30"]).max_clock_skew_seconds == 15
    assert load(ServeSettings, ["--label-topic", "labels"]).max_clock_skew_seconds == 60
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(ConfigError, match="max_clock_skew_seconds"):
            load(ServeSettings, ["--max-clock-skew-seconds", bad])
    settings = load(
        ServeSettings, ["--label-topic", "labels", "--label-grace-seconds", "30", "--max-clock-skew-seconds", "5"]
    )
    assert settings.max_clock_skew_seconds == 5
    assert load(ServeSettings, ["--label-topic", "labels", "--label-grace-seconds", "0"])  # no wait: nothing to bound


def test_a_bad_config_file_is_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("batch_size = = 3")
    with pytest.raises(ConfigError, match=r"config_file.*not valid TOML"):
        load(ServeSettings, ["--config-file", str(bad)])
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("bach_size = 3")
    with pytest.raises(ConfigError, match="unknown settings: bach_size"):
        load(ServeSettings, ["--config-file", str(unknown)])


def test_sasl_password_is_never_echoed():
    with pytest.raises(ConfigError) as error:
        load(
            ServeSettings,
            ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-password", "hunter2"],
        )
    assert "hunter2" not in str(error.value)


def test_security_settings_reach_the_kafka_client(tmp_path):
    from perceptron_stream.kafka import client_options

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    s = load(
        ServeSettings,
        [
            "--bootstrap-servers",
            "k1:9093,k2:9093",
            "--security-protocol",
            "SASL_SSL",
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--sasl-username",
            "svc",
            "--sasl-password",
            "s3cret",
            "--ssl-cafile",
            str(ca),
            "--ssl-password",
            "keyp4ss",
        ],
    )
    assert client_options(s) == {
        "bootstrap_timeout_ms": 3000,
        "reconnect_backoff_max_ms": 5000,
        "bootstrap_servers": ["k1:9093", "k2:9093"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "s3cret",
        "ssl_cafile": str(ca),
        "ssl_password": "keyp4ss",
    }
    assert "s3cret" not in repr(s) and "keyp4ss" not in repr(s)


def test_model_bound_settings(monkeypatch):
    s = load(ServeSettings, [])
    assert (s.max_model_features, s.hash_features) == (50_000, 0)
    monkeypatch.setenv("PERCEPTRON_STREAM_MAX_MODEL_FEATURES", "0")  # no cap: any number of buckets
    s = load(ServeSettings, ["--hash-features", "1048576"])
    assert (s.max_model_features, s.hash_features) == (0, 1 << 20)


def test_produce_settings_defaults():
    s = load(ProduceSettings, ["--stream", "credit", "--count", "5"])
    assert (s.topic, s.stream, s.count, s.rate) == ("points", "credit", 5, 0.0)


def test_the_command_exits_2_with_the_message():
    result = subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", "serve", "--batch-size", "-3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "invalid setting batch_size (--batch-size, PERCEPTRON_STREAM_BATCH_SIZE)" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", "nonsense"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "unknown command 'nonsense'" in result.stderr


def test_the_longest_commit_interval_is_half_the_transaction_timeout():
    """A transaction open past its timeout is aborted by the brokers and its producer fenced: a commit interval
    near it would stop every instance at its first commit."""
    from perceptron_stream.config import MAX_COMMIT_INTERVAL_MS
    from perceptron_stream.kafka.contract import TRANSACTION_TIMEOUT_MS

    assert MAX_COMMIT_INTERVAL_MS == TRANSACTION_TIMEOUT_MS // 2
    assert load(ServeSettings, ["--commit-interval-ms", str(MAX_COMMIT_INTERVAL_MS)]).commit_interval_ms == 5000


@pytest.mark.parametrize("command", ["serve", "explain", "model at"])
def test_every_command_that_takes_the_signing_key_reads_it_from_a_file_the_same_way(command, tmp_path):
    """serve signs with --checkpoint-key, explain and model at check the history with it: each takes it from
    --checkpoint-key-file (whitespace around it removed), and refuses both at once, or a file too short, naming it."""
    from perceptron_stream.config import ExplainSettings, ModelAtSettings, signing_key

    cases: dict[str, tuple[type[ServeSettings | ExplainSettings | ModelAtSettings], list[str]]] = {
        "serve": (ServeSettings, []),
        "explain": (ExplainSettings, ["--prediction", "out:0:1", "--model-history-topic", "h"]),
        "model at": (
            ModelAtSettings,
            ["--version", "1", "--output", str(tmp_path / "m.json"), "--model-history-topic", "h"],
        ),
    }
    settings_cls, needed = cases[command]
    key_file = tmp_path / "key"
    key_file.write_text("  a-key-of-sixteen-or-more\n")
    assert (
        signing_key(load(settings_cls, [*needed, "--checkpoint-key-file", str(key_file)]))
        == b"a-key-of-sixteen-or-more"
    )
    assert signing_key(load(settings_cls, needed)) is None
    with pytest.raises(ConfigError, match="give checkpoint_key or checkpoint_key_file, not both"):
        load(settings_cls, [*needed, "--checkpoint-key-file", str(key_file), "--checkpoint-key", "x" * 16])
    key_file.write_text("short")
    with pytest.raises(ConfigError, match=f"checkpoint_key_file {key_file} must hold a key of at least 16"):
        load(settings_cls, [*needed, "--checkpoint-key-file", str(key_file)])
    with pytest.raises(ConfigError, match="checkpoint_key"):
        load(settings_cls, [*needed, "--checkpoint-key", "short"])
