"""Configuration of every command, with pydantic-settings.

Each setting has three spellings, highest priority first: a flag
(``--bootstrap-servers``), an environment variable
(``PERCEPTRON_STREAM_BOOTSTRAP_SERVERS``), and a key in the optional TOML or
JSON file named by ``--config-file`` (``bootstrap_servers = "..."``).
A bad value stops the command before it connects to anything, with a message
that names the setting in all its spellings (see :func:`load`).

>>> s = load(ServeSettings, ["--input-topic", "events", "--batch-size", "200"])
>>> (s.input_topic, s.batch_size, s.output_topic)
('events', 200, 'predictions')
>>> load(ServeSettings, ["--batch-size", "0"])
Traceback (most recent call last):
...
perceptron_stream.config.ConfigError: invalid setting batch_size (--batch-size, PERCEPTRON_STREAM_BATCH_SIZE): Input should be greater than 0, got '0'
"""

from __future__ import annotations

import contextvars
import importlib.util
import json
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

ENV_PREFIX = "PERCEPTRON_STREAM_"

# The file named by --config-file for the settings being built now. A context
# variable because pydantic-settings asks the class, not the instance, for its
# sources.
_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("config_file", default=None)


#: The longest --commit-interval-ms: half the transactions' timeout (TRANSACTION_TIMEOUT_MS in
#: kafka/contract.py, 10 s; kept here as a number: settings import no Kafka module), so that a transaction is
#: committed before the brokers abort it, with room for the batch in hand and the commit itself
#: (tests/test_config.py holds the two together).
MAX_COMMIT_INTERVAL_MS = 5_000


def default_state_dir() -> Path:
    """The per-user state directory of the XDG Base Directory spec: never ``./state`` of wherever the command runs.

    >>> import os; os.environ["XDG_STATE_HOME"] = "/srv/state"; str(default_state_dir())
    '/srv/state/perceptron-stream'
    >>> del os.environ["XDG_STATE_HOME"]; default_state_dir() == Path.home() / ".local/state/perceptron-stream"
    True
    """
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "perceptron-stream"


class ConfigError(Exception):
    """A setting is wrong; the message names it. Commands exit with code 2.

    Raised by :func:`load` for what the settings show by themselves, and at start-up (:func:`invalid_setting`) for a
    setting only the brokers show to be wrong (exactly-once on the embedded broker): the same exit code either way.
    """


def invalid_setting(name: str, message: str) -> ConfigError:
    """The ConfigError of setting ``name``, in all its spellings, as :func:`load` words one.

    >>> str(invalid_setting("processing_guarantee", "exactly-once cannot hold here"))
    'invalid setting processing_guarantee (--processing-guarantee, PERCEPTRON_STREAM_PROCESSING_GUARANTEE): exactly-once cannot hold here'
    """
    return ConfigError(f"invalid setting {name} ({flag(name)}, {env_var(name)}): {message}")


class _FileSource(PydanticBaseSettingsSource):
    """Values from the TOML or JSON file of ``--config-file``, below env and flags."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None):
        super().__init__(settings_cls)
        self.values: dict[str, Any] = {}
        if path is None:
            return
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"invalid setting config_file (--config-file): cannot read {path}: {exc.strerror}"
            ) from exc
        try:
            data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"invalid setting config_file (--config-file): {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}"
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"invalid setting config_file (--config-file): {path} must hold a table of settings")
        known = {field.alias or name for name, field in settings_cls.model_fields.items()}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"invalid setting config_file (--config-file): {path} has unknown settings: {', '.join(unknown)}"
            )
        self.values = data

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is used instead
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


#: What ``--help`` shows for a value of each type (pydantic-settings shows the Python type: ``{Path,null}``).
METAVARS: dict[Any, str] = {Path: "PATH", SecretStr: "SECRET", str: "TEXT", int: "INT", float: "NUMBER"}


class _ReadableCli(CliSettingsSource):
    """The command line of a settings class, its ``--help`` in a user's words: ``--ssl-cafile PATH``,
    ``--sasl-password SECRET``, ``--label-topic TEXT``, where pydantic-settings prints the Python types
    (``{Path,null}``, ``{SecretStr,null}``, ``{str,null}``). A setting that may be absent is just not given, so
    ``null`` is no choice worth showing; a fixed set of values stays a set (``{plain,averaged,pocket,margin}``).

    >>> cli = _ReadableCli(KafkaSettings)
    >>> cli._metavar_format(Path | None), cli._metavar_format(SecretStr | None), cli._metavar_format(int)
    ('PATH', 'SECRET', 'INT')
    >>> cli._metavar_format(Literal["PLAIN", "SCRAM-SHA-256"] | None)
    '{PLAIN,SCRAM-SHA-256}'
    """

    def _metavar_format(self, obj: Any) -> str:
        args = typing.get_args(obj)
        if typing.get_origin(obj) in (typing.Union, types.UnionType) and type(None) in args:
            rest = [arg for arg in args if arg is not type(None)]
            if len(rest) == 1:
                obj = rest[0]
        if obj in METAVARS:
            return METAVARS[obj]
        return super()._metavar_format(obj)  # a Literal's set of values; bool, which becomes --x/--no-x


class CommandSettings(BaseSettings):
    """Shared behaviour: env prefix, kebab-case flags, file source, strictness."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_exit_on_error=False,
        extra="forbid",
        validate_default=True,
    )

    config_file: Path | None = Field(
        None, description="TOML or JSON file of settings (flags and env vars override it)."
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, env_settings, _FileSource(settings_cls, _config_file.get()))


def _key_from_file(settings) -> None:
    """``settings.checkpoint_key`` from ``checkpoint_key_file``, if given (the one reading of the key's file for every
    command that takes it); ValueError naming the setting when it cannot be used."""
    if settings.checkpoint_key_file is None:
        return
    if settings.checkpoint_key is not None:
        raise ValueError("give checkpoint_key or checkpoint_key_file, not both")
    try:
        text = settings.checkpoint_key_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"checkpoint_key_file {settings.checkpoint_key_file} cannot be read: {exc}") from None
    if len(text) < 16:
        raise ValueError(
            f"checkpoint_key_file {settings.checkpoint_key_file} must hold a key of at least 16 characters"
        )
    settings.checkpoint_key = SecretStr(text)


def signing_key(settings) -> bytes | None:
    """--checkpoint-key as bytes (None: not set): what signs checkpoints, mix records and the model history's records,
    for each command that writes or reads them."""
    return settings.checkpoint_key.get_secret_value().encode() if settings.checkpoint_key else None


#: The description of --checkpoint-key-file, for every command that takes the key.
_KEY_FILE = "File holding --checkpoint-key (its content, surrounding whitespace removed)."


class KafkaSettings(CommandSettings):
    """How to reach the brokers; passed through to the Kafka client."""

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", min_length=1, description="Kafka bootstrap servers, host:port[,host:port]."
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism when the protocol is SASL_*."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password (never logged).")
    ssl_cafile: Path | None = Field(None, description="CA bundle to verify the brokers (SSL, SASL_SSL).")
    ssl_certfile: Path | None = Field(None, description="Client certificate (mutual TLS).")
    ssl_keyfile: Path | None = Field(None, description="Client private key (mutual TLS).")
    ssl_password: SecretStr | None = Field(
        None, description="Password of the client private key, when it is encrypted (never logged)."
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _every_server_has_a_port(cls, value: str) -> str:
        """Each entry is host:port: without a port the clients guess one, and a wrong guess is retried forever
        with nothing naming this setting.

        >>> KafkaSettings._every_server_has_a_port("kafka-1:9092,[::1]:9093")
        'kafka-1:9092,[::1]:9093'
        >>> KafkaSettings._every_server_has_a_port("127.0.0.1")
        Traceback (most recent call last):
        ...
        ValueError: '127.0.0.1' has no port: give every server as host:port (e.g. 127.0.0.1:9092)
        """
        for server in value.split(","):
            host, colon, port = server.strip().rpartition(":")
            if not colon or not host or host.endswith(":") or not port.isdigit() or not 0 < int(port) < 65536:
                example = f"{server.strip() or 'localhost'}:9092" if not colon else "127.0.0.1:9092"
                raise ValueError(
                    f"{server.strip()!r} has no port: give every server as host:port (e.g. {example})"
                    if not colon or host.endswith(":")
                    else f"{server.strip()!r} is not host:port with a port from 1 to 65535 (e.g. {example})"
                )
        return value

    @model_validator(mode="after")
    def _security_is_complete(self):
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism is None:
                raise ValueError("sasl_mechanism must be set when security_protocol is " + self.security_protocol)
            if self.sasl_username is None or self.sasl_password is None:
                raise ValueError(f"sasl_username and sasl_password must be set for SASL {self.sasl_mechanism}")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path} is not a readable file")
        return self


class ServeSettings(KafkaSettings):
    """Settings of ``perceptron-stream serve``."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream serve")

    input_topic: str = Field("points", min_length=1, description="Topic of labeled and unlabeled points.")
    output_topic: str = Field("predictions", min_length=1, description="Topic the predictions are published to.")
    dlq_topic: str = Field("points.dlq", min_length=1, description="Dead-letter topic for rejected events.")
    group_id: str = Field("perceptron-stream", min_length=1, description="Kafka consumer group.")
    kafka_client: Literal["kafka-python", "confluent"] = Field(
        "kafka-python",
        description="Client of the poll loop: kafka-python, or confluent (librdkafka, the confluent extra; "
        "several times faster).",
    )
    group_protocol: Literal["classic", "consumer"] = Field(
        "classic",
        description="Consumer group protocol: classic (JoinGroup/SyncGroup; every broker), or consumer (KIP-848, "
        "Apache Kafka 4.0+ and --kafka-client confluent only: incremental rebalances, partitions that stay where they are "
        "are never stopped; session timeout and heartbeat are the brokers' group.consumer.* settings).",
    )
    model_scope: Literal["group", "partition"] = Field(
        "group",
        description="group: one model over every partition, one active instance per group. partition: one replica "
        "per input partition, checkpointed and moved with it; any number of instances share the group (needs the kafka "
        "store, or a --state-dir every instance shares).",
    )
    mix_every: int = Field(
        1000,
        ge=0,
        description="Partition scope: every N events a replica learns from, it publishes its state to "
        "--mix-topic and mixes its weights with every partition's latest, weighted by their mistakes (0: never; "
        "independent replicas).",
    )
    mix_topic: str = Field(
        "perceptron-stream.mix", min_length=1, description="Compacted topic of the replicas' states (partition scope)."
    )
    challengers: str = Field(
        "",
        description="Comma-separated variants stepped beside the champion on the same events, scored, never "
        "published: averaged, pocket, plain, margin:γ (e.g. averaged,pocket,margin:0.5).",
    )
    learning: Literal["on", "off"] = Field(
        "on",
        description="off: predict, publish and count mistakes, never update (a model trained offline served as it is).",
    )
    initial_model: Path | None = Field(
        None,
        description="A model file (train --output, model export) a new model starts from; ignored, with a log "
        "line, when a checkpoint exists.",
    )
    label_topic: str | None = Field(
        None,
        description='Topic of delayed labels {"id", "y"}, keyed like their points, with the input topic\'s partition '
        "count. A point with an id and no y is then kept until its label comes: the model learns from it then, and the "
        "published decision's outcome is counted and published on --outcome-topic.",
    )
    outcome_topic: str = Field(
        "predictions.outcomes", min_length=1, description="Topic of the outcomes of joined delayed labels."
    )
    label_ttl_seconds: float = Field(
        604_800.0,
        gt=0,
        description="How long a point waits for its label before it expires, in stream time (the latest point's or "
        "label's timestamp in its partition): a backfill of old history keeps its points as it did when live.",
    )
    max_pending: int = Field(
        1_000_000, gt=0, description="Most points waiting for a label, per partition; the oldest are evicted beyond it."
    )
    # 300 s: the longest a producer's defaults let a record be delivered after its send() (librdkafka's
    # message.timeout.ms 300,000; the Java client's and kafka-python's delivery.timeout.ms 120,000, which bound
    # linger.ms, retries and back-pressure alike): a point sent before its label is on the brokers by then, or never.
    label_grace_seconds: float = Field(
        300.0,
        ge=0,
        allow_inf_nan=False,
        description="How long a label whose point has not come waits for it (stream time: the partition's points' "
        "timestamps, or the input read to its end). Then it is dead-lettered unknown_id. Default: the longest delivery "
        "timeout of the producers' defaults (librdkafka's message.timeout.ms, 300 s): a point sent before its label is "
        "on the brokers by then, or never.",
    )
    # 60 s: far beyond the agreement of clocks kept by NTP (milliseconds), well within the grace's 300 s default;
    # half a grace of 120 s or less, so that a grace that was valid before this bound existed stays valid.
    max_clock_skew_seconds: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="How far a record's timestamp is believed ahead of this instance's wall clock (a point's or a "
        "label's), and a label's behind the points' stream time, by the clocks of the delayed-label join (the grace "
        "and the TTL, both stream time). A timestamp beyond it is clamped to it: the record counts, its claim of time "
        "moves no clock further. Less than --label-grace-seconds: one point stamped that far ahead would otherwise "
        "let every waiting label go. Default: 60 s, or half --label-grace-seconds when that is less than 120 s.",
    )
    max_early_labels: int = Field(
        100_000,
        gt=0,
        description="Most labels waiting for their point, per partition; beyond it the oldest is dead-lettered "
        "unknown_id at once. The label partition is paused once half of it waits (or all but a --batch-size, if "
        "less), and read again at half of that.",
    )
    pending_topic: str = Field(
        "perceptron-stream.pending",
        min_length=1,
        description="Compacted changelog of the pending points (--state-store kafka with --label-topic; partitioned like the input).",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a new group starts: earliest learns from the whole retained history."
    )
    # 1,000: an event's every feature at most (a reason is ~70 bytes: 70 kB a prediction, within any record limit)
    explain: int = Field(
        0,
        ge=0,
        le=1000,
        description="Reason codes: each prediction carries the K features with the largest absolute contribution "
        "to its score (feature, value as the model saw it, weight, contribution), largest first, and the bias "
        "(0: off).",
    )
    model_history_topic: str | None = Field(
        None,
        min_length=1,
        description="The model history (off when unset): the champion's full state now and then and, between, "
        "each change (an update, a scaler's step, a join, a mix), so that `perceptron-stream explain` rebuilds the "
        "weights behind any prediction published; keep it as long as the predictions to explain.",
    )
    history_snapshot_every: int = Field(
        10_000,
        ge=1,
        le=100_000_000,
        description="The model history's full state every so many changes: a rebuild replays at most this many.",
    )
    history_challengers: bool = Field(
        False,
        description="The model history keeps each challenger's changes too (keyed by its name beside the "
        "champion's): `explain --challenger NAME` and `model at --challenger NAME` rebuild them.",
    )
    variant: Literal["plain", "averaged", "pocket", "margin"] = Field("plain", description="Perceptron variant.")
    margin: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="γ of the margin variant: update when y·score ≤ γ."
    )
    standardize: bool = Field(
        False, description="Standardise features online (river StandardScaler) before the perceptron."
    )
    # 50,000: the largest model (averaged or pocket, --standardize: 4 names and 5 numbers a feature) with
    # 20-30 character names checkpoints to 7.9 MiB, under half the kafka store's 16 MiB record (100,000: 15.8 MiB,
    # 99%); bench/checkpoint_size.py measures it.
    max_model_features: int = Field(
        50_000,
        ge=0,
        description="Most features the model holds (0: no cap). Past it, a labeled event's new features are left out "
        "(it is predicted and learned from on the others) and counted in perceptron_dropped_features_total; unlabeled "
        "events never add features. At 50,000 with 20-30 character names the largest checkpoint (averaged or pocket, "
        "--standardize) is 7.9 MiB, under half the kafka store's 16 MiB (bench/checkpoint_size.py).",
    )
    hash_features: int = Field(
        0,
        ge=0,
        le=1 << 24,
        description="Hash feature names into this many buckets before the model (river FeatureHasher, MurmurHash3; "
        "0: off), for open-ended names: the model then holds at most this many weights, names that share a bucket "
        "share a weight. Dense x is hashed as the features 0..d-1. At most --max-model-features.",
    )
    batch_size: int = Field(1000, gt=0, le=100_000, description="Most records taken per poll.")
    poll_timeout_ms: int = Field(200, gt=0, le=60_000, description="How long one poll waits for records.")
    # At 5 ms kafka-python 3.0.12 stalled against the embedded broker (fetches answered, no records
    # returned, for minutes: 2 runs in 2); never at 20 ms (a dozen runs at 5,000-8,000 events/s). On
    # Apache Kafka a shorter wait gains nothing: its brokers answer as soon as records arrive.
    fetch_max_wait_ms: int = Field(
        20,
        ge=20,
        le=60_000,
        description="Longest a broker holds a fetch that finds no new records (Kafka's fetch.max.wait.ms). "
        "Apache Kafka answers as soon as records arrive; the embedded broker waits it out, so it bounds latency there.",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Address of /metrics, /healthz, /readyz and /model (0.0.0.0 in containers)."
    )
    metrics_port: int = Field(
        8000, ge=0, le=65535, description="Port of /metrics, /healthz, /readyz and /model (0 picks a free port)."
    )
    mistake_rate_window: int = Field(
        1000,
        gt=0,
        description="Decisions scored (labeled events, and delayed labels joined with their point) in the sliding window of perceptron_mistake_rate.",
    )
    healthz_timeout_seconds: float = Field(
        30.0, gt=0, description="/healthz fails when the poll loop has not turned for this long."
    )
    # 15 s: a stop whose brokers answer took 0.24-0.32 s (the batch in hand, its flush, the final
    # checkpoint, the commit, the close); one that has not ended in 15 s waits on a call that may never
    # return. Half of Kubernetes' default grace period (30 s) stays as margin before its SIGKILL.
    stop_timeout_seconds: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="After SIGTERM or SIGINT the process exits within this long: if the batch in hand, the final "
        "checkpoint, the commit and the close are not done by then (a client call that never returns, "
        "brokers that do not answer), it exits 1 saying what was left undone (nothing is checkpointed "
        "past what the brokers acknowledged). Keep it under the orchestrator's grace period "
        "(Kubernetes: terminationGracePeriodSeconds, 30 s by default).",
    )
    state_store: Literal["local", "kafka", "none"] = Field(
        "local", description="Where checkpoints go: a local directory, a compacted Kafka topic, or nowhere."
    )
    state_dir: Path = Field(
        default_state_dir(),
        description="Directory of the local checkpoint store; each consumer group keeps its checkpoints in a "
        "directory of its own inside it. Default: $XDG_STATE_HOME/perceptron-stream, else ~/.local/state/perceptron-stream.",
    )
    checkpoint_key: SecretStr | None = Field(
        None,
        min_length=16,
        description="Secret that signs checkpoints and the model history's records (HMAC-SHA256); unsigned or badly "
        "signed checkpoints are refused as damaged. Give it in the environment or with --checkpoint-key-file, not on "
        "a command line others can read (never logged).",
    )
    checkpoint_key_file: Path | None = Field(None, description=_KEY_FILE)
    start_over: bool = Field(
        False,
        description="When the state store holds only checkpoints of another cluster, topic or log (positions outside "
        "the partitions' logs), or the group has committed offsets and no checkpoint, start a new model from "
        "--auto-offset-reset instead of stopping. This model's own usable checkpoints are still restored.",
    )
    checkpoint_topic: str = Field(
        "perceptron-stream.checkpoints", min_length=1, description="Compacted topic of the kafka checkpoint store."
    )
    checkpoint_interval_events: int = Field(10_000, gt=0, description="Checkpoint after this many events.")
    checkpoint_interval_seconds: float = Field(
        30.0, gt=0, description="Checkpoint at least this often while events flow."
    )
    processing_guarantee: Literal["at-least-once", "exactly-once"] = Field(
        "at-least-once",
        description="at-least-once: outputs are acknowledged before the offsets are committed (a crash repeats some "
        "outputs). exactly-once: a span's outputs, its checkpoint and its input positions are committed in one Kafka "
        "transaction, every --commit-interval-ms (read_committed readers see each input's outputs once), with "
        "delayed labels' changelog and mix records; needs --state-store kafka and Apache Kafka (not the embedded "
        "broker).",
    )
    commit_interval_ms: int = Field(
        100,
        gt=0,
        le=MAX_COMMIT_INTERVAL_MS,
        description="exactly-once: how often the open transaction is committed with its checkpoints and positions "
        "(Kafka Streams' default under exactly-once); outputs become visible to read_committed readers then. "
        f"At most {MAX_COMMIT_INTERVAL_MS}: the brokers abort a transaction open longer than its timeout (10 s) and "
        "fence its producer. at-least-once checkpoints by --checkpoint-interval-events/-seconds instead.",
    )
    create_topics: bool = Field(
        True, description="Create missing topics at start-up; when off, a missing topic is an error."
    )
    topic_partitions: int = Field(1, gt=0, description="Partitions of topics the service creates.")
    topic_replication_factor: int = Field(1, gt=0, description="Replication factor of topics the service creates.")
    max_message_bytes: int = Field(
        1_000_000,
        ge=1024,
        description="Larger input messages (key + value) are dead-lettered; a dead letter (key + value) stays within it too. "
        "Keep it 1 KiB or more under the brokers' message.max.bytes: a prediction carries its input's key and id.",
    )
    max_features: int = Field(10_000, gt=0, description="Events with more features are dead-lettered.")
    max_feature_value: float = Field(
        1e15, gt=0, le=1e100, description="Events with a feature of larger magnitude are dead-lettered (out_of_range)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")

    @field_validator("challengers")
    @classmethod
    def _challengers_parse(cls, value: str) -> str:
        from perceptron_stream.learning.challengers import parse_challengers

        parse_challengers(value)  # ValueError naming the challenger
        return value

    @model_validator(mode="after")
    def _consistent(self):
        _key_from_file(self)
        if len({self.input_topic, self.output_topic, self.dlq_topic}) < 3:
            raise ValueError("input_topic, output_topic and dlq_topic must be three different topics")
        if self.margin > 0 and self.variant != "margin":
            raise ValueError(f"margin {self.margin} is only used by variant margin (variant is {self.variant})")
        if self.hash_features and self.max_model_features and self.hash_features > self.max_model_features:
            raise ValueError(
                f"hash_features {self.hash_features} is more than max_model_features {self.max_model_features}: "
                "the buckets past the cap would never be learned; lower hash_features, or raise "
                "max_model_features (mind the checkpoint size: bench/checkpoint_size.py)"
            )
        if self.learning == "off" and self.model_scope == "partition" and self.mix_every:
            raise ValueError("learning off with mix_every > 0: mixing changes the weights; use --mix-every 0")
        if self.max_clock_skew_seconds is None:  # the default: within any grace
            grace = self.label_grace_seconds
            self.max_clock_skew_seconds = 60.0 if grace <= 0 else min(60.0, grace / 2)
        if self.label_topic is not None:
            used = {self.input_topic, self.output_topic, self.dlq_topic}
            if self.label_topic in used or self.outcome_topic in used | {self.label_topic}:
                raise ValueError(
                    "label_topic and outcome_topic must differ from each other and from the input, output and "
                    "dead-letter topics"
                )
            if 0 < self.label_grace_seconds <= self.max_clock_skew_seconds:
                raise ValueError(
                    f"max_clock_skew_seconds {self.max_clock_skew_seconds:g} is not less than label_grace_seconds "
                    f"{self.label_grace_seconds:g}: one point stamped that far ahead of the wall clock would move the "
                    "grace clock past every waiting label's grace; lower max_clock_skew_seconds (or raise "
                    "label_grace_seconds)"
                )
            if self.max_early_labels <= self.batch_size:  # the gate's pause point would be 1 (LabelGate)
                raise ValueError(
                    f"max_early_labels {self.max_early_labels} is not more than batch_size {self.batch_size}: one "
                    "poll may bring a batch of labels ahead of their points, so the label partition would be paused "
                    "at its first early label; raise max_early_labels above batch_size (or lower batch_size)"
                )
        if self.model_scope == "partition":
            if self.state_store == "none":
                raise ValueError(
                    "model_scope partition needs state every instance can read: --state-store kafka, or "
                    "--state-store local with a --state-dir every instance shares (not none)"
                )
            if self.mix_every and self.variant == "pocket":
                raise ValueError(
                    "variant pocket cannot mix (mix_every > 0): the pocket is the weights with the longest run "
                    "of correct predictions on one replica's stream, and a mix of pockets has no run; use "
                    "--mix-every 0 (independent replicas) or another variant"
                )
            if len({self.input_topic, self.output_topic, self.dlq_topic, self.mix_topic}) < 4:
                raise ValueError("mix_topic must differ from the input, output and dead-letter topics")
        if self.history_challengers and (self.model_history_topic is None or not self.challengers):
            raise ValueError("history_challengers needs --model-history-topic and --challengers: whose history?")
        if self.model_history_topic is not None:
            others = {self.input_topic, self.output_topic, self.dlq_topic, self.label_topic, self.outcome_topic}
            if self.model_history_topic in others | ({self.mix_topic} if self.mix_every else set()):
                raise ValueError(
                    "model_history_topic must differ from the input, output, dead-letter, label, outcome and mix topics"
                )
        if self.kafka_client == "confluent" and importlib.util.find_spec("confluent_kafka") is None:
            raise ValueError("kafka_client confluent needs confluent-kafka: pip install 'perceptron-stream[confluent]'")
        if self.group_protocol == "consumer" and self.kafka_client != "confluent":
            raise ValueError(
                "group_protocol consumer (KIP-848) needs --kafka-client confluent: kafka-python speaks only the "
                "classic group protocol"
            )
        if self.processing_guarantee == "exactly-once" and self.state_store != "kafka":
            raise ValueError(
                f"--processing-guarantee exactly-once needs --state-store kafka (it is {self.state_store}): the "
                "checkpoint must be committed in the same Kafka transaction as the outputs and the input "
                "positions, and a local directory (or no store) cannot join a Kafka transaction"
            )
        if self.initial_model is not None:
            self._initial_model_fits()
        return self

    def _initial_model_fits(self) -> None:
        """--initial-model is a model file (the ModelFile contract) of a model these settings can run (its variant,
        margin, scaler, hashing, features): checked here, so a file of another variant is a bad setting at start-up
        (exit 2), not a refusal later. Its size is checked before it is read: a file of 10 million features (149 MB)
        took 7.8 s and 2.3 GB of memory to be refused for its feature count."""
        import orjson
        from perceptron_stream.learning import model_file
        from perceptron_stream.model_format import ModelFile

        path = self.initial_model
        assert path is not None  # the caller's test
        try:
            size = path.stat().st_size
            largest = model_file.largest_file_bytes(self.max_model_features or None)
            if largest is not None and size > largest:
                raise ValueError(
                    f"{size:,} bytes, more than a model file of --max-model-features {self.max_model_features:,} "
                    f"features can be ({largest:,} bytes at most); raise --max-model-features to start from it"
                )
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"initial_model {path} cannot be read: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"initial_model {path} (--initial-model) does not fit: {exc}") from None
        try:
            ModelFile.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            raise ValueError(
                f"initial_model {path} is not a model file: {first['msg']} at "
                f"{'.'.join(map(str, first['loc'])) or 'the top'}"
            ) from None
        try:
            self.learner_from_model_file(orjson.loads(data))
        except ValueError as exc:
            raise ValueError(f"initial_model {path} (--initial-model) does not fit: {exc}") from None

    def learner_from_model_file(self, doc: dict):
        """The learner a model file (``doc``, parsed) starts under these settings; a ValueError naming what of the
        file does not fit them. One home for the check at start-up and the start itself (runtime/factory.py)."""
        from perceptron_stream.learning import model_file

        return model_file.to_learner(
            doc,
            variant=self.variant,
            margin=self.margin,
            standardize=self.standardize,
            hash_features=self.hash_features,
            max_features=self.max_model_features or None,
            max_event_features=self.max_features,
        )


class ProduceSettings(KafkaSettings):
    """Settings of ``perceptron-stream produce``."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream produce")

    topic: str = Field("points", min_length=1, description="Topic to write to.")
    stream: Literal["separable", "noisy", "drift", "credit"] = Field(
        "separable", description="Synthetic stream to generate (ignored with --file)."
    )
    file: Path | None = Field(
        None, description="Replay a CSV or JSONL file instead of generating (JSONL lines are sent as they are)."
    )
    dense: bool = Field(
        False,
        description="With a CSV --file: send each row's feature columns as a dense x, in column order "
        "(as train --dense reads them), not as named features.",
    )
    unlabeled_rows: bool = Field(
        False,
        description="With a CSV --file that has a y column: send a row whose y is empty as an unlabeled event "
        "(predicted, not learned). Without it such a row stops the replay, naming its line.",
    )
    count: int = Field(
        10_000,
        ge=0,
        description="Events to write (0: forever). With --file the whole file is sent unless --count is given.",
    )
    rate: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="Events per second (0: as fast as possible).")
    dimensions: int = Field(10, gt=0, le=10_000, description="Features of the separable/noisy/drift streams.")
    margin: float = Field(
        0.1,
        ge=0.0,
        le=0.99,
        allow_inf_nan=False,
        description="Margin γ of the separable/noisy/drift streams: every point is γ or more from the hidden separator. "
        "Points have ‖x‖ ≤ 1, so γ must stay below 1 (at most 0.99: room for the bias and for x's 6 decimals).",
    )
    noise: float = Field(
        0.05, ge=0.0, le=1.0, allow_inf_nan=False, description="Fraction of flipped labels (noisy, drift, credit)."
    )
    drift_every: int = Field(
        5_000,
        gt=0,
        description="drift: events between quarter turns of the separator; credit: events before the bank's policy changes.",
    )
    unlabeled: float = Field(
        0.0, ge=0.0, le=1.0, allow_inf_nan=False, description="Fraction of events sent without a label."
    )
    seed: int = Field(
        42,
        description="Random seed: the same seed writes the same stream, byte for byte (with --label-topic, the same "
        "points and the same labels, each topic in the same order; only their interleaving in time depends on the clock).",
    )
    partitions: int = Field(
        1, gt=0, description="Partitions if the topic is created (the label topic gets --topic's count)."
    )
    label_topic: str | None = Field(
        None,
        min_length=1,
        description='Delayed labels: send each synthetic event to --topic without its y, and its label {"id", "y"} to '
        "this topic --label-delay-seconds later, keyed like its point (the same partition number: created with --topic's "
        "partition count, and checked). Not with --file. Default: labels inline, in each event.",
    )
    label_delay_seconds: float = Field(
        5.0,
        ge=0.0,
        allow_inf_nan=False,
        description="With --label-topic: how long after its point a label is sent. At the end of the stream the command "
        "waits for the labels still to come, unless stopped.",
    )
    label_missing: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="With --label-topic: share of the labeled points whose label never comes (seeded; the --unlabeled share "
        "gets no label either).",
    )
    progress: bool = Field(True, description="Show a progress bar on stderr (a terminal only).")

    @model_validator(mode="after")
    def _labels_consistent(self):
        if self.label_topic is None:
            if (
                self.label_missing > 0
                or self.label_delay_seconds != type(self).model_fields["label_delay_seconds"].default
            ):
                raise ValueError(
                    "label_delay_seconds (--label-delay-seconds) and label_missing (--label-missing) are only used "
                    "with label_topic (--label-topic)"
                )
            return self
        if self.label_topic == self.topic:
            raise ValueError("label_topic (--label-topic) and topic (--topic) must be two different topics")
        if self.file is not None:
            raise ValueError(
                "file (--file) and label_topic (--label-topic) cannot be combined: delayed labels are sent "
                "for the synthetic streams only; replay a file's labels inline (without --label-topic), or "
                "write its points and labels to the two topics yourself"
            )
        return self


class BrokerSettings(CommandSettings):
    """Settings of ``perceptron-stream broker``."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream broker")

    host: str = Field("127.0.0.1", description="Address the embedded broker listens on.")
    port: int = Field(9092, ge=0, le=65535, description="Port the embedded broker listens on (0 picks a free port).")


class TrainSettings(CommandSettings):
    """Settings of ``perceptron-stream train``."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream train")

    data: Path = Field(..., description="CSV (header, label column y) or JSONL in the wire format.")
    algorithm: Literal["pla", "pocket"] = Field("pla", description="Batch algorithm.")
    order: Literal["cyclic", "random"] = Field("cyclic", description="Order in which each pass visits the points.")
    seed: int | None = Field(None, description="Seed of the random order.")
    max_passes: int = Field(100, gt=0, description="τ: most passes over the data.")
    output: Path | None = Field(
        None, description="Also write the result as a model file (serve --initial-model takes it)."
    )
    dense: bool = Field(
        False,
        description="Read a CSV's feature columns as a dense x, in column order, as the service numbers the values of "
        '{"x": [...]} events (features 0..d-1), rather than as named features (the column names, which only '
        '{"features": {...}} events share). The model file says which (its input). A JSONL file\'s events say it themselves.',
    )


class ModelExportSettings(KafkaSettings):
    """Settings of ``perceptron-stream model export``: the newest checkpoint of a model, as a model file."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream model export")

    output: Path = Field(..., description="Where to write the model file.")
    group_id: str = Field("perceptron-stream", min_length=1, description="The model's consumer group.")
    input_topic: str = Field("points", min_length=1, description="The model's input topic.")
    task: str = Field(
        "model", min_length=1, description="model (group scope), or partition-N (a replica of partition scope)."
    )
    state_store: Literal["local", "kafka"] = Field("local", description="Where the checkpoints are.")
    state_dir: Path = Field(default_state_dir(), description="Directory of the local checkpoint store.")
    checkpoint_topic: str = Field(
        "perceptron-stream.checkpoints", min_length=1, description="Compacted topic of the kafka store."
    )
    checkpoint_key: SecretStr | None = Field(None, description="The key checkpoints are signed with (never logged).")


class HistoryReaderSettings(KafkaSettings):
    """What the readers of a model history (``explain``, ``model at``) share: the key its records are signed with."""

    checkpoint_key: SecretStr | None = Field(
        None,
        min_length=16,
        description="The service's --checkpoint-key: every record of the model history read must be signed with it "
        "(one unsigned, altered or moved from another model's history is left out, and said). Give it in the "
        "environment or with --checkpoint-key-file (never logged).",
    )
    checkpoint_key_file: Path | None = Field(None, description=_KEY_FILE)

    @model_validator(mode="after")
    def _key(self):
        _key_from_file(self)
        return self


class ExplainSettings(HistoryReaderSettings):
    """Settings of ``perceptron-stream explain``: a published prediction's model rebuilt from the model history,
    and the parts of its score."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream explain")

    prediction: str = Field(
        ...,
        pattern=r"^[A-Za-z0-9._-]+:[0-9]+:[0-9]+$",
        description="The prediction to explain, as TOPIC:PARTITION:OFFSET of the output topic (where it was published).",
    )
    model_history_topic: str = Field(..., min_length=1, description="The service's --model-history-topic.")
    group_id: str = Field("perceptron-stream", min_length=1, description="The service's consumer group.")
    challenger: str | None = Field(
        None,
        min_length=1,
        description="Explain what this challenger (a name of --challengers: averaged, margin:0.5, ...) scored the "
        "event, from its history (--history-challengers); it publishes no score to check against.",
    )
    as_json: bool = Field(
        False,
        alias="json",
        description="One JSON object (version, score rebuilt, published_score, equal, reasons, ...) rather than a "
        "table.",
    )
    timeout_seconds: float = Field(120.0, gt=0.0, description="How long each topic's read may take.")


class ModelAtSettings(HistoryReaderSettings):
    """Settings of ``perceptron-stream model at VERSION``: a version of a model, rebuilt from its model history, as a
    model file (the format ``model export`` writes: ``serve --initial-model`` takes it)."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream model at")

    version: int = Field(..., ge=0, description="The version (the model's updates) to write: model at VERSION.")
    output: Path = Field(..., description="Where to write the model file.")
    model_history_topic: str = Field(..., min_length=1, description="The service's --model-history-topic.")
    group_id: str = Field("perceptron-stream", min_length=1, description="The model's consumer group.")
    task: str = Field(
        "model", min_length=1, description="model (group scope), or partition-N (a replica of partition scope)."
    )
    run: str | None = Field(
        None,
        min_length=1,
        description="The run whose version to write (a prediction's model.run): a version learned again after a "
        "crash (at-least-once) is in two runs; by default the last one that reached it.",
    )
    challenger: str | None = Field(
        None,
        min_length=1,
        description="A challenger's model (its name in --challengers; the service ran with --history-challengers), "
        "at its own version: promote it with serve --initial-model.",
    )
    timeout_seconds: float = Field(120.0, gt=0.0, description="How long the history's read may take.")


class DemoSettings(CommandSettings):
    """Settings of ``perceptron-stream demo``."""

    model_config = SettingsConfigDict(cli_prog_name="perceptron-stream demo")

    duration: float = Field(0.0, ge=0.0, description="Stop after this many seconds (0: until Ctrl-C).")
    rate: float = Field(500.0, gt=0.0, description="Events per second of the credit stream.")
    metrics_port: int = Field(8000, ge=0, le=65535, description="Port of the service's /metrics.")
    broker_port: int = Field(0, ge=0, le=65535, description="Port of the embedded broker (0 picks a free port).")
    standardize: bool = Field(True, description="Standardise the credit features online.")
    variant: Literal["plain", "averaged", "pocket", "margin"] = Field(
        "averaged",
        description="Perceptron variant of the champion (averaged shows the climb and recovery at the policy "
        "change best); the others of averaged, plain and pocket run beside it as challengers.",
    )
    noise: float = Field(0.02, ge=0.0, le=1.0, description="Fraction of flipped labels in the credit stream.")
    delayed_labels: bool = Field(
        False,
        description="Delayed labels: the producer sends each application now and its outcome about 3 s later on a "
        "label topic of its own (5% never come), and the service joins them (serve --label-topic).",
    )
    live: bool = Field(True, description="Show the live terminal view (off: print a line every few seconds).")


Settings = TypeVar("Settings", bound=CommandSettings)


def flag(name: str) -> str:
    """The command-line spelling of a setting: ``batch_size`` → ``--batch-size``."""
    return "--" + name.replace("_", "-")


def env_var(name: str) -> str:
    """The environment spelling: ``batch_size`` → ``PERCEPTRON_STREAM_BATCH_SIZE``."""
    return ENV_PREFIX + name.upper()


def _config_file_arg(args: list[str]) -> Path | None:
    for i, arg in enumerate(args):
        if arg == "--config-file" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--config-file="):
            return Path(arg.split("=", 1)[1])
    value = os.environ.get(env_var("config_file"))
    return Path(value) if value else None


def load(cls: type[Settings], args: list[str]) -> Settings:
    """Build ``cls`` from flags, env and file; raise ConfigError naming the setting."""
    token = _config_file.set(_config_file_arg(args))
    try:
        return cls(_cli_settings_source=_ReadableCli(cls)(args=args))
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(error) for error in exc.errors())) from None
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None
    finally:
        _config_file.reset(token)


def _describe(error: ErrorDetails) -> str:
    loc = [str(part) for part in error.get("loc", ()) if not isinstance(part, int)]
    message = error["msg"].removeprefix("Value error, ")
    if not loc:  # a check across settings: its message names them
        return f"invalid settings: {message}"
    name = loc[0]
    got = error.get("input")
    shown = "" if got is None or isinstance(got, dict) else f", got {got!r}"
    if "password" in name or name.startswith("checkpoint_key"):
        shown = ""
    return f"invalid setting {name} ({flag(name)}, {env_var(name)}): {message}{shown}"
