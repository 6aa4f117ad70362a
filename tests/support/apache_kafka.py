"""Apache Kafka for the tests: one KRaft broker (combined broker + controller) on loopback.

The broker is the one users run (compose runs ``apache/kafka``), fetched from
Maven Central with the version pinned in ``tests/apache_kafka/pom.xml`` and
run from its jars with the machine's Java 17: no Docker engine is needed.
``tests/run.sh`` installs Java and Maven when missing and calls
``python3 tests/support/apache_kafka.py --fetch`` so the download happens
before pytest; :func:`kafka_lib` does the same on demand.

One broker serves a whole test run (the xdist controller starts it, see
``tests/conftest.py``); tests share it with topics and groups of their own.
It listens on five loopback ports, each a way users connect:

- ``PLAINTEXT``; ``SSL`` (server certificate only) and ``MTLS`` (a client
  certificate required), with the certificates of :mod:`tests.support.pki`;
- ``SASL_PLAINTEXT`` and ``SASL_SSL`` with SCRAM-SHA-256/512, for the user
  :data:`SCRAM_USER` (created at format time, as ``kafka-storage format
  --add-scram`` does).

Settings are those of a single node (replication factors 1, no initial
rebalance delay) plus a log cleaner that wakes every second, so compaction
tests see it run on topics created with small segments.

Run alone, it starts a broker and prints its addresses until Ctrl-C::

    python3 tests/support/apache_kafka.py
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
POM = HERE.parent / "apache_kafka" / "pom.xml"
SCRAM_USER, SCRAM_PASSWORD = "perceptron", "scram secret of the tests"
LISTENERS = ("PLAINTEXT", "SSL", "MTLS", "SASL_PLAINTEXT", "SASL_SSL")
#: the API key of ConsumerGroupHeartbeat (KIP-848): Apache Kafka 4.x answers it, the embedded broker does not
CONSUMER_GROUP_HEARTBEAT = 68


class ApacheKafkaError(RuntimeError):
    """The broker could not be fetched or did not come up; the message says what to look at."""


def cache_dir() -> Path:
    """Where the jars live: a folder per pom.xml, so a version change fetches anew."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "perceptron-stream" / f"apache-kafka-{digest}"


def kafka_lib() -> Path:
    """The folder of the broker's jars, fetched with Maven the first time."""
    lib = cache_dir() / "lib"
    if (lib / ".complete").exists():
        return lib
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise ApacheKafkaError(
            "Apache Kafka's tests need Java 17 and Maven: run `bash tests/run.sh` once "
            "(it installs Debian's default-jre-headless and maven)"
        )
    partial = lib.with_name(f"lib.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise ApacheKafkaError(
            f"mvn could not fetch Apache Kafka ({POM}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    (partial / ".complete").touch()
    try:
        partial.rename(lib)
    except OSError:  # another process fetched it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return lib


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nobody listens on right now (held open together, so the OS gives distinct ones)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class BrokerAddresses:
    """What a test needs to reach a running broker; JSON-able, so xdist workers get it from the controller."""

    name: str
    cluster_id: str
    ports: dict[str, int]
    pki_dir: str
    log_path: str
    pid: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return self.address("PLAINTEXT")

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    @property
    def pki(self):
        from tests.support.pki import pki_in

        return pki_in(Path(self.pki_dir))


class ApacheKafka:
    """One KRaft broker in ``root``; a context manager.

    ``start(wait=False)`` only launches the JVM (the xdist controller does so
    and lets the workers wait); :meth:`wait_ready` waits until a client gets
    metadata from it.
    """

    name = "apache-kafka"

    def __init__(
        self, root: Path, heap: str = "512m", properties: dict[str, str] | None = None, quick_start: bool = False
    ):
        from tests.support.pki import make_pki

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        pki_dir = self.root / "pki"
        pki_dir.mkdir(exist_ok=True)
        self.pki = make_pki(pki_dir)
        self.heap = heap
        self.quick_start = quick_start
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        ports = free_ports(len(LISTENERS) + 1)
        self.controller_port = ports.pop()
        self.info = BrokerAddresses(
            self.name, self.cluster_id, dict(zip(LISTENERS, ports)), str(pki_dir), str(self.root / "broker.log")
        )
        self.extra_properties = properties or {}
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.info.bootstrap_servers

    def address(self, listener: str) -> str:
        return self.info.address(listener)

    # configuration ---------------------------------------------------------
    def _properties(self) -> dict[str, str]:
        ports, pki = self.info.ports, self.pki
        listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"{listeners},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": listeners,
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
            "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.root / "data"),
            # a single node
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",  # 50 by default: the first group join would wait for them all
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            # the coordinator looks for transactions past their timeout every second (10 s by default): a killed
            # instance's open transaction holds read_committed readers TRANSACTION_TIMEOUT_MS and about a second more
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # KIP-848 groups: the brokers own the session and heartbeat; the service's classic timings (6 s, 1 s)
            "group.consumer.min.session.timeout.ms": "6000",
            "group.consumer.session.timeout.ms": "6000",
            "group.consumer.min.heartbeat.interval.ms": "1000",
            "group.consumer.heartbeat.interval.ms": "1000",
            "num.partitions": "1",
            # the cleaner wakes every second (15 s by default): compaction tests see it run
            "log.cleaner.backoff.ms": "1000",
            # its offset map, allocated whole when the broker starts (128 MiB by default): a broker of a test's own
            # (-Xmx256m) died of "OutOfMemoryError: Java heap space" in "Error starting LogManager" once in a full
            # run; the tests' compacted topics hold a few thousand keys
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            # TLS: PEM files, as the clients use
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": pki.server_cert.read_text().strip().replace("\n", "\\n"),
            "ssl.keystore.key": pki.server_key.read_text().strip().replace("\n", "\\n"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.certificates": pki.ca.read_text().strip().replace("\n", "\\n"),
            "listener.name.mtls.ssl.client.auth": "required",
            # SASL/SCRAM
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            **{
                f"listener.name.{lst}.{mech}.sasl.jaas.config": scram
                for lst in ("sasl_plaintext", "sasl_ssl")
                for mech in ("scram-sha-256", "scram-sha-512")
            },
        }
        props.update(self.extra_properties)
        return props

    def _write_config(self) -> Path:
        path = self.root / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self._properties().items()))
        (self.root / "log4j2.properties").write_text(
            "appender.file.type = File\n"
            f"appender.file.name = file\nappender.file.fileName = {self.info.log_path}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = WARN\nrootLogger.appenderRef.file.ref = file\n"
            "logger.started.name = kafka.server.KafkaRaftServer\nlogger.started.level = INFO\n"
            # what the log cleaner did (a few lines a cleaning): compaction tests show it when they fail
            "logger.cleaner.name = org.apache.kafka.storage.internals.log.LogCleaner\nlogger.cleaner.level = INFO\n"
            "logger.cleaner_scala.name = kafka.log.LogCleaner\nlogger.cleaner_scala.level = INFO\n"
        )
        return path

    # life -----------------------------------------------------------------
    def start(self, wait: bool = True, timeout: float = 120.0) -> ApacheKafka:
        """Format the log dir and launch the JVM; with ``wait``, until it serves clients.

        A free port can be taken by another process between our choosing it and
        the broker binding it (the suite's workers start brokers and services at
        once): a broker that exits for want of its port is started again on
        new ports, up to three times."""
        for attempt in range(3):
            self._launch()
            if not wait:
                return self
            try:
                return self.wait_ready(timeout)
            except ApacheKafkaError:
                if attempt == 2 or not self._lost_a_port():
                    raise
                self.stop()
                shutil.rmtree(self.root / "data", ignore_errors=True)
                ports = free_ports(len(LISTENERS) + 1)
                self.controller_port = ports.pop()
                self.info.ports = dict(zip(LISTENERS, ports))
        raise AssertionError("unreachable")

    def _lost_a_port(self) -> bool:
        logs = [self.root / "stdout.log", Path(self.info.log_path)]
        return any("Address already in use" in path.read_text(errors="replace") for path in logs if path.exists())

    def _launch(self, format_storage: bool = True) -> None:
        lib = kafka_lib()
        config = self._write_config()
        java = [
            "java",
            f"-Xmx{self.heap}",
            "-Xss1m",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp",
            f"{lib}/*",
        ]
        # The JIT's first tier only and the serial collector: a JVM that lives for seconds (the storage format; a
        # broker of one test's own) starts in about half the time and spares the other workers' CPU the optimising
        # compiler's threads (own broker ready in 4.4-5.6 s against 7.8-9.7 s, three of each in turn, loaded
        # machine). The run's broker serves the whole suite: the JVM's defaults.
        quick = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
        scram = [f"SCRAM-SHA-{bits}=[name={SCRAM_USER},password={SCRAM_PASSWORD}]" for bits in (256, 512)]
        if format_storage:  # a restart keeps the data it left
            fmt = subprocess.run(
                [
                    *java,
                    *quick,
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    f"--cluster-id={self.cluster_id}",  # an id may start with "-"
                    "-c",
                    str(config),
                    *[arg for s in scram for arg in ("--add-scram", s)],
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if fmt.returncode != 0:
                raise ApacheKafkaError(f"kafka-storage format failed:\n{fmt.stdout[-2000:]}{fmt.stderr[-2000:]}")
        self._stdout: IO[bytes] | None = open(self.root / "stdout.log", "ab")  # noqa: SIM115 — the broker's output for its life: stop() closes it
        self.process = subprocess.Popen(
            [*java, *(quick if self.quick_start else []), "kafka.Kafka", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.info.pid = self.process.pid

    def wait_ready(self, timeout: float = 120.0) -> ApacheKafka:
        wait_ready(self.info, timeout, self.process)
        return self

    def pause(self) -> None:
        """SIGSTOP: the broker stops answering but keeps its state (outage tests)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the broker is gone at once, as in a crash; :meth:`restart` brings it back on its data (outage
        tests: every connection refused, where a frozen broker's stay open)."""
        self._signal(signal.SIGKILL)
        assert self.process is not None
        self.process.wait()
        self.stop()

    def restart(self, timeout: float = 120.0) -> ApacheKafka:
        """The broker again, on the same ports and the data it left (not formatted anew), until it serves clients."""
        self._launch(format_storage=False)
        return self.wait_ready(timeout)

    def _signal(self, sig: int) -> None:
        if self.process is None or self.process.poll() is not None:
            raise ApacheKafkaError("the broker is not running")
        self.process.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        stdout = getattr(self, "_stdout", None)
        if stdout is not None:
            stdout.close()
            self._stdout = None

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_ready(info: BrokerAddresses, timeout: float = 120.0, process: subprocess.Popen | None = None) -> None:
    """Until the broker answers a metadata request on its PLAINTEXT listener with itself as a live broker."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    last = "nothing yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            lines = Path(info.log_path).read_text(errors="replace").splitlines() if Path(info.log_path).exists() else []
            last_lines = "\n".join(line for line in lines if " ERROR " in line or "Exception" in line)[-2000:]
            raise ApacheKafkaError(
                f"Apache Kafka exited with code {process.returncode}; see {info.log_path}:\n{last_lines}"
            )
        try:  # a plain connect first: the client would log every refusal and back off for seconds
            socket.create_connection(("127.0.0.1", info.ports["PLAINTEXT"]), timeout=1).close()
        except OSError:
            time.sleep(0.1)
            continue
        try:
            admin = KafkaAdminClient(bootstrap_servers=info.bootstrap_servers, request_timeout_ms=5000)
        except (KafkaError, OSError) as exc:
            last = repr(exc)
            time.sleep(0.3)
            continue
        try:
            if admin.describe_cluster().get("cluster_id") == info.cluster_id:
                return
            last = "another cluster answered"
        except (KafkaError, OSError) as exc:
            last = repr(exc)
        finally:
            admin.close()
        time.sleep(0.3)
    raise ApacheKafkaError(f"Apache Kafka not ready after {timeout:.0f} s ({last}); see {info.log_path}")


#: Topic settings under which Apache Kafka's cleaner compacts within seconds (the suite's broker wakes it every
#: second): a segment rolled for nearly every record (the active one is never compacted), any dirty share worth
#: cleaning. The service's own settings for a topic go on top (e.g. the changelog's min.compaction.lag.ms).
FAST_COMPACTION = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "max.message.bytes": str(16 * 1024 * 1024),
}


def create_compacting_topic(bootstrap: str, name: str, partitions: int = 1, **config: str) -> None:
    """``name`` with :data:`FAST_COMPACTION` and ``config``, before the service would create it with its own settings."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs={**FAST_COMPACTION, **config})])
    finally:
        admin.close()


def records_left(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records readable from the start of ``topic``'s partition 0, its end offset: every record ever written)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        read = 0
        while consumer.position(tp) < end:
            read += sum(len(messages) for messages in consumer.poll(timeout_ms=500).values())
        return read, end
    finally:
        consumer.close()


def to_json(info: BrokerAddresses) -> str:
    return json.dumps(asdict(info))


def from_json(text: str) -> BrokerAddresses:
    return BrokerAddresses(**json.loads(text))


if __name__ == "__main__":  # pragma: no cover - a developer's tool
    sys.path.insert(0, str(HERE.parent.parent))
    if sys.argv[1:] == ["--fetch"]:
        print(kafka_lib())
        sys.exit(0)
    import tempfile

    with ApacheKafka(Path(tempfile.mkdtemp(prefix="apache-kafka-"))) as broker:
        print(json.dumps(asdict(broker.info), indent=2), flush=True)
        assert broker.process is not None
        try:
            broker.process.wait()
        except KeyboardInterrupt:
            pass
