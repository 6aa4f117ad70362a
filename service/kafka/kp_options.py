"""How the service builds its kafka-python clients: the connection and security options, the producer's
settings, and the codecs every reader needs.

Every kafka-python client of the service (the stream's, the admin calls',
the compacted topics') is built from :func:`kafka_python_options`, so each
gets the mended network client (:mod:`perceptron_stream.kafka.kp_mends`).
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaProducer
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.contract import KafkaFatal
from perceptron_stream.kafka.errors import CODEC_PACKAGES, translated
from perceptron_stream.kafka.kp_mends import net_client, require_mends

#: The service flushes its producer at the end of every batch, so its records
#: wait for that flush: one produce request per batch. With a short linger the
#: sender thread wakes every few ms mid-batch and fights the poll loop for the
#: GIL and the accumulator's locks; that made each send about twice as
#: expensive (py-spy, bench/README.md "End to end"). A batch that outgrows
#: ``batch_size`` is still sent at once.
LINGER_UNTIL_FLUSH_MS = 60_000


#: What the poll loop reads, with either client: committed records only. An upstream that writes points in
#: transactions (Kafka Streams or Quix Streams with exactly-once) aborts some; their records stay in the log,
#: and a read_uncommitted reader (kafka-python's default) would predict them and learn from them. The reader
#: waits at the first open transaction (the last stable offset) until it commits or aborts.
ISOLATION_LEVEL = "read_committed"


def missing_codecs() -> dict[str, str]:
    """Codec → package, for each codec Kafka defines that kafka-python cannot decompress here (none: {})."""
    from kafka import codec

    available = {"snappy": codec.has_snappy, "lz4": codec.has_lz4, "zstd": codec.has_zstd}
    return {name: CODEC_PACKAGES[name] for name, has in available.items() if not has()}


def require_codecs() -> None:
    """Raise KafkaFatal, naming the packages, when kafka-python cannot decompress every codec Kafka defines.

    Checked at start-up whichever client runs the loop (kafka-python reads
    the checkpoint and mix topics in any case): a missing package would
    otherwise show only when a producer first compresses with its codec.
    """
    missing = missing_codecs()
    if missing:
        packages = sorted(set(missing.values()))
        raise KafkaFatal(
            f"kafka-python cannot decompress {', '.join(missing)} (not installed: {', '.join(packages)})",
            f"pip install {' '.join(packages)} (dependencies of perceptron-stream: reinstalling the service "
            "installs them)",
        )


def client_options(settings: KafkaSettings) -> dict[str, Any]:
    """bootstrap servers and the security settings, as kafka-python takes them."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers.split(","),
        "security_protocol": settings.security_protocol,
        # bounded attempts, so the caller's retry loop stays responsive to
        # signals and health checks, and a returning broker is found quickly
        "bootstrap_timeout_ms": 3000,
        "reconnect_backoff_max_ms": 5000,
    }
    if settings.sasl_mechanism:
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        if settings.sasl_password is not None:
            options["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if getattr(settings, name) is not None:
            options[name] = str(getattr(settings, name))
    if settings.ssl_password is not None:
        options["ssl_password"] = settings.ssl_password.get_secret_value()
    return options


#: How long the brokers hold a fetch that finds nothing new (Kafka's default: 500 ms) for the readers of a
#: topic's whole log (checkpoints, the pending changelog, the logs' ranges) and the mix topic's tail. A read of a
#: whole log ends on such a fetch (an empty topic's first, the quiet one past the end): at 500 ms every restore
#: waited half a second for nothing. 20 ms, the poll loop's floor (--fetch-max-wait-ms: kafka-python stalled at 5 ms).
READ_FETCH_MAX_WAIT_MS = 20


def kafka_python_options(settings: KafkaSettings) -> dict:
    """:func:`client_options` and the network client every kafka-python client here is built with.

    Raises KafkaFatal, before any client is built, when the installed kafka-python lacks what a mend of its bugs
    patches (:func:`perceptron_stream.kafka.kp_mends.require_mends`).
    """
    require_mends()
    return {**client_options(settings), "kafka_client": net_client}


@translated
def make_producer(settings: KafkaSettings, **overrides) -> KafkaProducer:
    """A producer that waits for all in-sync replicas (acks=all) and batches briefly."""
    options = {
        "acks": "all",
        "linger_ms": 5,
        "batch_size": 256 * 1024,
        "max_request_size": 4 * 1024 * 1024,
        "retries": 5,
        "max_block_ms": 10_000,
        **overrides,
    }
    return KafkaProducer(**kafka_python_options(settings), **options)
