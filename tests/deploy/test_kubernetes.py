"""Static checks of deploy/kubernetes/: no cluster runs on our machines.

- Every manifest of a built-in kind is validated with kubernetes-validate
  (the OpenAPI schemas it ships) in strict mode, which rejects unknown fields,
  against one fixed Kubernetes version.
- kubernetes-validate has no schema for custom resources: the ServiceMonitor
  and PrometheusRule (monitoring.coreos.com/v1, Prometheus Operator) and the
  Kustomization are checked structurally here instead, against the fields we
  use as the operator's CRDs define them (types and duration pattern).
- The PrometheusRule is generated from deploy/prometheus/alerts.yml
  (``python -m tests.deploy.test_kubernetes`` rewrites it) and a test fails
  when the two differ by a character.
- The parts that must agree are cross-checked: ConfigMap keys are real
  settings whose values load, probes hit paths the service's HTTP endpoints
  really serve, on the port the service listens on, the Service and
  ServiceMonitor select what they should, the PVC holds the state dir, and
  the security context is locked down.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError
from perceptron_stream.config import ENV_PREFIX, ServeSettings

from tests.support import ROOT
from tests.support.manifests import (
    DOCKERFILE,
    KUBERNETES_VERSION,
    MANIFESTS,
    PROMETHEUSRULE_SCHEMA,
    SERVICEMONITOR_SCHEMA,
    commented_block,
    dockerfile_env,
    documents,
    kustomized_image,
    serve_settings,
)

ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUSRULE = MANIFESTS / "prometheusrule.yaml"

BUILTIN_KINDS = {"ConfigMap", "Secret", "PersistentVolumeClaim", "Deployment", "Service"}
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "Kustomization"}

PROMETHEUSRULE_HEADER = """\
# GENERATED from deploy/prometheus/alerts.yml by `python -m tests.deploy.test_kubernetes`:
# edit alerts.yml (and its unit tests, alerts_test.yml), then regenerate; a test
# fails when the two differ.
#
# The alert rules for the Prometheus Operator (CRD monitoring.coreos.com/v1).
# The operator's Prometheus loads only the PrometheusRules its ruleSelector
# matches, as it scrapes only the ServiceMonitors its serviceMonitorSelector
# matches: kube-prometheus-stack selects `release: <its Helm release name>` by
# default; set that label in kustomization.yaml (see `labels:` there).
# The ServiceMonitor's targets get job="perceptron-stream" (the Service's name),
# the job PerceptronTargetDown watches.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: perceptron-stream
  labels:
    app.kubernetes.io/name: perceptron-stream
    app.kubernetes.io/component: model-server
spec:
"""


def prometheusrule_text(alerts: str | None = None) -> str:
    """deploy/kubernetes/prometheusrule.yaml as generated from alerts.yml: its groups, comments kept, under spec."""
    alerts = ALERTS.read_text() if alerts is None else alerts
    lines = alerts.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "\n".join(("  " + line) if line.strip() else "" for line in lines[start:])
    return PROMETHEUSRULE_HEADER + body + "\n"


def _manifest_files() -> list[Path]:
    files = sorted(MANIFESTS.glob("*.yaml")) + sorted(MANIFESTS.glob("*.yml"))
    assert files, f"no manifests in {MANIFESTS}"
    return files


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    """kind -> the one object of that kind."""
    found: dict[str, dict] = {}
    for path in _manifest_files():
        for doc in documents(path):
            assert doc["kind"] not in found, f"two objects of kind {doc['kind']}"
            found[doc["kind"]] = doc
    return found


@pytest.fixture(scope="module")
def container(objects) -> dict:
    containers = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def dockerfile_uid() -> int:
    users = [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("USER ")]
    assert len(users) == 1
    return int(users[0].split(":")[0])


def pod_env(objects) -> dict[str, str]:
    """The container's environment as Kubernetes builds it: image ENV < envFrom < env."""
    env = dockerfile_env()
    env.update(objects["ConfigMap"]["data"])
    return env


# --------------------------------------------------------------------------- schema validation


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_manifest_is_valid_for_kubernetes(path):
    for doc in documents(path):
        if doc["kind"] in CUSTOM_KINDS:
            with pytest.raises(SchemaNotFoundError):  # why these are checked structurally below
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            continue
        assert doc["kind"] in BUILTIN_KINDS, f"unexpected kind {doc['kind']} in {path.name}"
        assert "namespace" not in doc["metadata"], "manifests are namespace-less: kubectl -n / kustomize sets it"
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_expected_kind_is_there(objects):
    assert set(objects) == BUILTIN_KINDS | CUSTOM_KINDS


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda c: c.__setitem__("livenesProbe", c.pop("livenessProbe")), "livenesProbe"),  # a typo
        (lambda c: c["securityContext"].__setitem__("readOnlyRootFilesystem", "yes"), "yes"),  # a wrong type
        (lambda c: c["ports"][0].__setitem__("containerPort", "8000"), "8000"),
    ],
)
def test_strict_validation_rejects_broken_deployments(objects, mutate, field):
    broken = copy.deepcopy(objects["Deployment"])
    mutate(broken["spec"]["template"]["spec"]["containers"][0])
    with pytest.raises(ValidationError) as error:
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    assert field in str(error.value)


def test_servicemonitor_structure(objects):
    jsonschema.validate(objects["ServiceMonitor"], SERVICEMONITOR_SCHEMA)
    broken = copy.deepcopy(objects["ServiceMonitor"])
    broken["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SERVICEMONITOR_SCHEMA)


def test_servicemonitor_scrapes_the_services_metrics_port(objects):
    monitor, service = objects["ServiceMonitor"], objects["Service"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    port_names = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint.get("path", "/metrics") == "/metrics"


def test_prometheusrule_is_generated_from_the_alert_rules(objects):
    assert PROMETHEUSRULE.read_text() == prometheusrule_text(), (
        "deploy/kubernetes/prometheusrule.yaml differs from deploy/prometheus/alerts.yml: "
        "run `python -m tests.deploy.test_kubernetes` to regenerate it"
    )
    assert objects["PrometheusRule"]["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_prometheusrule_generation_notices_a_changed_rule():
    changed = ALERTS.read_text().replace("perceptron_mistake_rate > 0.25", "perceptron_mistake_rate > 0.5", 1)
    assert changed != ALERTS.read_text()
    assert prometheusrule_text(changed) != PROMETHEUSRULE.read_text()


def test_prometheusrule_structure_and_rules_pass_promtool(objects, tmp_path):
    import shutil
    import subprocess

    rule = objects["PrometheusRule"]
    jsonschema.validate(rule, PROMETHEUSRULE_SCHEMA)
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["fro"] = "5m"  # a typo the operator would drop silently
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, PROMETHEUSRULE_SCHEMA)
    # what the operator hands its Prometheus: a rule file of these groups
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    promtool = shutil.which("promtool")
    assert promtool, (
        "promtool is not on PATH: install Debian's package with `apt-get install -y prometheus` (tests/run.sh does it)"
    )
    proc = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prometheusrule_and_servicemonitor_carry_the_same_labels(objects):
    assert objects["PrometheusRule"]["metadata"]["labels"] == objects["ServiceMonitor"]["metadata"]["labels"]


def test_kustomization_shows_how_to_add_the_release_label(objects):
    """kube-prometheus-stack finds ServiceMonitors and PrometheusRules by `release:`: one uncommented block sets it."""
    text = (MANIFESTS / "kustomization.yaml").read_text()
    block = yaml.safe_load(commented_block(text, "UNCOMMENT for kube-prometheus-stack"))
    assert set(block) == {"labels"}, block
    [entry] = block["labels"]
    assert set(entry["pairs"]) == {"release"}
    # only metadata labels: a selector change would orphan the Deployment's pods (selectors are immutable)
    assert entry["includeSelectors"] is False
    assert "includeTemplates" not in entry or entry["includeTemplates"] is False
    assert "labels" not in objects["Kustomization"]  # uncommenting adds the key, it does not duplicate one
    assert (
        yaml.safe_load(text + "\n" + commented_block(text, "UNCOMMENT for kube-prometheus-stack"))["labels"]
        == block["labels"]
    )


def test_kustomization_lists_the_manifests(objects):
    kustomization = objects["Kustomization"]
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    for resource in resources:
        assert (MANIFESTS / resource).is_file(), resource
    expected = {p.name for p in _manifest_files()} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(resources) == expected
    # the placeholder Secret must never be applied by `kubectl apply -k`
    assert "secret.example.yaml" not in resources
    image = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert {i["name"] for i in kustomization.get("images", [])} <= {image.split(":")[0]}


def test_kustomized_image_reader():
    entries = [{"name": "perceptron-stream", "newName": "registry.example/ps", "newTag": "1.2.3"}]
    assert kustomized_image("perceptron-stream:0.1.0", entries) == "registry.example/ps:1.2.3"
    assert (
        kustomized_image("perceptron-stream", [{"name": "perceptron-stream", "newTag": "2"}]) == "perceptron-stream:2"
    )
    assert kustomized_image("other:1", entries) == "other:1"
    assert kustomized_image("perceptron-stream", []) == "perceptron-stream:latest"


def test_one_image_name_and_tag_in_readme_compose_and_manifests(objects, container):
    """A user who builds the image the docs say (Docker Compose and Kubernetes pages), or lets Compose build it, and
    loads it into kind or minikube gets the image the Deployment asks for (IfNotPresent: a missing one is
    ImagePullBackOff)."""
    import tomllib

    deployed = kustomized_image(container["image"], objects["Kustomization"].get("images", []))
    assert container["imagePullPolicy"] in ("IfNotPresent", "Never"), "a loaded image must be used as it is"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    [built] = [service["image"] for service in compose["services"].values() if "build" in service]
    compose_page = (ROOT / "docs" / "getting-started" / "docker-compose.md").read_text(encoding="utf-8")
    kubernetes_page = (ROOT / "docs" / "getting-started" / "kubernetes.md").read_text(encoding="utf-8")
    commands = {
        "Docker Compose page's docker build": re.findall(
            r"docker build -f deploy/Dockerfile -t ([^\s`]+) \.", compose_page
        ),
        "Kubernetes page's docker build": re.findall(
            r"docker build -f deploy/Dockerfile -t ([^\s`]+) \.", kubernetes_page
        ),
        "Dockerfile docker build": re.findall(
            r"docker build -f deploy/Dockerfile -t ([^\s`]+) \.", DOCKERFILE.read_text()
        ),
        "Docker Compose page's docker run": re.findall(r"docker run ([^\s`]+)", compose_page),
        "Kubernetes page's kind load": re.findall(r"kind load docker-image ([^\s`]+)", kubernetes_page),
        "Kubernetes page's minikube image load": re.findall(r"minikube image load ([^\s`]+)", kubernetes_page),
    }
    for what, images in commands.items():
        assert images, f"no {what} command"
        for image in images:
            assert image == deployed, f"{what} uses {image}, the Deployment runs {deployed}"
    assert built == deployed, f"compose builds {built}, the Deployment runs {deployed}"
    assert f"`{deployed}`" in kubernetes_page  # named where the Kubernetes page says what it runs
    # the tag is the project's version: bump them together
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert deployed.rpartition(":")[2] == version


# --------------------------------------------------------------------------- settings


def test_the_kubelet_waits_for_the_service_to_stop_before_it_kills_it(objects, monkeypatch):
    """SIGKILL comes terminationGracePeriodSeconds after SIGTERM: after the service's own stop deadline."""
    settings = serve_settings(monkeypatch, pod_env(objects))
    assert (
        objects["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        > settings.stop_timeout_seconds
    )


def test_configmap_keys_are_serve_settings(objects):
    data = objects["ConfigMap"]["data"]
    assert data
    for name, value in data.items():
        assert name.startswith(ENV_PREFIX), name
        assert name.removeprefix(ENV_PREFIX).lower() in ServeSettings.model_fields, f"{name} is not a setting of serve"
        assert isinstance(value, str), f"{name}: ConfigMap values are text"


def test_configmap_values_load(objects, monkeypatch):
    settings = serve_settings(monkeypatch, pod_env(objects))
    assert settings.metrics_host == "0.0.0.0"
    assert settings.state_store in ("local", "kafka")


def test_deployment_env_names_are_settings_and_the_secret_is_optional(objects, container, monkeypatch):
    config_maps = [source["configMapRef"]["name"] for source in container["envFrom"]]
    assert config_maps == [objects["ConfigMap"]["metadata"]["name"]]
    secret = objects["Secret"]
    for var in container.get("env", []):
        assert var["name"].removeprefix(ENV_PREFIX).lower() in ServeSettings.model_fields, var["name"]
        ref = var["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"]
        assert ref["optional"] is True  # the example Secret is not applied
    names = {var["name"] for var in container.get("env", [])}
    assert f"{ENV_PREFIX}SASL_PASSWORD" in names
    # with SASL turned on, the ConfigMap plus the Secret's password make valid settings
    env = pod_env(objects) | {
        f"{ENV_PREFIX}SECURITY_PROTOCOL": "SASL_SSL",
        f"{ENV_PREFIX}SASL_MECHANISM": "SCRAM-SHA-512",
        f"{ENV_PREFIX}SASL_USERNAME": "perceptron-stream",
        f"{ENV_PREFIX}SASL_PASSWORD": secret["stringData"]["sasl-password"],
    }
    password = serve_settings(monkeypatch, env).sasl_password
    assert password is not None and password.get_secret_value() == secret["stringData"]["sasl-password"]


def test_secret_is_a_clearly_marked_placeholder(objects):
    text = (MANIFESTS / "secret.example.yaml").read_text()
    assert "EXAMPLE" in text and "placeholder" in text.lower()
    for value in objects["Secret"]["stringData"].values():
        assert "CHANGE-ME" in value
    assert "data" not in objects["Secret"]  # no base64 that could hide a real value


# --------------------------------------------------------------------------- the Deployment


def test_one_instance_recreated_never_rolled(objects):
    spec = objects["Deployment"]["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert "Recreate" in (MANIFESTS / "deployment.yaml").read_text().split("strategy:")[0]  # the reason is written


def _container_port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


def _served_status(path: str) -> int:
    """The HTTP status the service's own endpoints answer for ``path`` (a fresh, not-ready service)."""
    import urllib.error
    import urllib.request

    from perceptron_stream.http import HttpEndpoints
    from perceptron_stream.metrics import ServiceMetrics
    from perceptron_stream.runtime.health import Health

    endpoints = HttpEndpoints(
        ServiceMetrics(window=10, version="test", variant="plain"), Health(30.0), "127.0.0.1", 0
    ).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoints.port}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    finally:
        endpoints.stop()


def test_probe_and_scrape_paths_are_served_by_the_service(objects, container):
    """Each probe's and the ServiceMonitor's path is a route of HttpEndpoints, not a string we hope is one."""
    paths = {
        probe: container[probe]["httpGet"]["path"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe")
        if probe in container
    }
    paths |= {
        f"ServiceMonitor endpoint {i}": e.get("path", "/metrics")
        for i, e in enumerate(objects["ServiceMonitor"]["spec"]["endpoints"])
    }
    for what, path in paths.items():
        assert _served_status(path) != 404, f"{what} asks {path}, which the service does not serve"
    assert _served_status("/metrics") == 200 and _served_status("/healthz") == 200  # live right after start
    assert _served_status("/readyz") == 503  # not ready: nothing assigned yet
    assert _served_status("/healthzz") == 404  # the check can fail


def test_probes_hit_healthz_and_readyz_on_the_metrics_port(objects, container, monkeypatch):
    metrics_port = serve_settings(monkeypatch, pod_env(objects)).metrics_port
    assert [p["containerPort"] for p in container["ports"]] == [metrics_port]
    expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
    assert {"livenessProbe", "readinessProbe"} <= set(container)
    for probe, path in expected.items():
        if probe not in container:
            continue
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert _container_port(container, get["port"]) == metrics_port, probe


def test_service_selects_the_pod_and_targets_the_metrics_port(objects, container, monkeypatch):
    metrics_port = serve_settings(monkeypatch, pod_env(objects)).metrics_port
    service = objects["Service"]
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    selector = objects["Deployment"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics"
    assert _container_port(container, port["targetPort"]) == metrics_port


def test_container_runs_locked_down(objects, container):
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == dockerfile_uid() != 0
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert pod.get("hostNetwork") is not True and pod.get("hostPID") is not True
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert not security["capabilities"].get("add")
    assert security.get("privileged") is not True


def _quantity(value) -> float:
    units = {"m": 1e-3, "": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    found = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert found, value
    number, unit = found.groups()
    return float(number) * units[unit]


def test_resources_have_requests_within_limits(container):
    resources = container["resources"]
    for kind in ("cpu", "memory"):
        request, limit = resources["requests"][kind], resources["limits"][kind]
        assert 0 < _quantity(request) <= _quantity(limit), kind
    assert _quantity(resources["limits"]["memory"]) >= 256 * 2**20  # river + kafka-python + the model


def test_writable_paths_are_volumes(objects, container, monkeypatch):
    """The root filesystem is read-only: /tmp and the state dir must be mounts."""
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in container["volumeMounts"]}
    assert "emptyDir" in mounts["/tmp"]
    settings = serve_settings(monkeypatch, pod_env(objects))
    assert settings.state_store == "local", "these manifests keep checkpoints on the PVC"
    state = mounts[str(settings.state_dir)]
    assert str(settings.state_dir) == "/var/lib/perceptron-stream"
    pvc = objects["PersistentVolumeClaim"]
    assert state["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert _quantity(pvc["spec"]["resources"]["requests"]["storage"]) > 0


def test_the_container_runs_serve_of_the_image(container):
    assert container.get("args", ["serve"]) == ["serve"]
    assert "command" not in container  # keep the image's ENTRYPOINT perceptron-stream
    entrypoint = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT")]
    assert json.loads(entrypoint[0].split(" ", 1)[1]) == ["perceptron-stream"]


if __name__ == "__main__":  # regenerate deploy/kubernetes/prometheusrule.yaml and the scale-out set's copy
    for path in (PROMETHEUSRULE, MANIFESTS / "scale-out" / PROMETHEUSRULE.name):
        path.write_text(prometheusrule_text())
        print(f"wrote {path.relative_to(ROOT)}")
