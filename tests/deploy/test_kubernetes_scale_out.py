"""Static checks of deploy/kubernetes/scale-out/: partition scope on several pods, scaled by KEDA.

The set is the base (deploy/kubernetes/) with what partition scope needs, as
plain manifests (kustomize refuses a base that contains its overlay). So:

- it renders as ``kubectl kustomize`` builds it (its own files and ``images:``,
  nothing else: :func:`render` refuses what it does not know), and where
  kubectl is installed, kubectl's build is compared with that rendering;
- built-in kinds pass ``kubernetes-validate --strict``; the ScaledObject (KEDA,
  keda.sh/v1alpha1) is checked against the fields of KEDA's CRD it uses, its
  HPA behaviour as the HorizontalPodAutoscaler KEDA makes of it;
- the Service, ServiceMonitor and PrometheusRule are copies of the base's; the
  ConfigMap and Deployment equal the base's but for the settings and fields
  partition scope needs, listed here;
- what must agree does: the trigger's group, topic and brokers are the
  ConfigMap's, the pods never outnumber the partitions the service creates
  the input topic with, the PodDisruptionBudget and the ScaledObject select
  the Deployment.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from perceptron_stream.config import ENV_PREFIX

from tests.support.manifests import (
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

SCALE_OUT = MANIFESTS / "scale-out"
COPIES = ("service.yaml", "servicemonitor.yaml", "prometheusrule.yaml")
BUILTIN_KINDS = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
CUSTOM_SCHEMAS = {"ServiceMonitor": SERVICEMONITOR_SCHEMA, "PrometheusRule": PROMETHEUSRULE_SCHEMA}

#: The settings partition scope changes (or adds, or drops) in the base's ConfigMap; every other is the base's.
PARTITION_SCOPE_SETTINGS = {
    ENV_PREFIX + name
    for name in (
        "MODEL_SCOPE",
        "STATE_STORE",
        "STATE_DIR",
        "CHECKPOINT_TOPIC",
        "MIX_EVERY",
        "MIX_TOPIC",
        "TOPIC_PARTITIONS",
    )
}


def render(directory: Path) -> list[dict]:
    """The objects ``kubectl kustomize directory`` builds, for a kustomization of plain resources and ``images:``."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - {"apiVersion", "kind", "resources", "images"}
    assert not unknown, (
        f"render() does not know kustomization fields {sorted(unknown)}: teach it, or keep to plain resources"
    )
    out = []
    for resource in kustomization["resources"]:
        path = directory / resource
        assert path.is_file() and path.parent == directory, f"{resource}: kustomize loads only files inside {directory}"
        for doc in documents(path):
            for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                container["image"] = kustomized_image(container["image"], kustomization.get("images", []))
            out.append(doc)
    return out


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    found: dict[str, dict] = {}
    for doc in render(SCALE_OUT):
        assert doc["kind"] not in found, f"two objects of kind {doc['kind']}"
        found[doc["kind"]] = doc
    return found


@pytest.fixture(scope="module")
def base() -> dict[str, dict]:
    return {doc["kind"]: doc for path in MANIFESTS.glob("*.yaml") for doc in documents(path)}


@pytest.fixture
def settings(objects, monkeypatch):
    return serve_settings(monkeypatch, dockerfile_env() | objects["ConfigMap"]["data"])


# --------------------------------------------------------------------------- the set


def test_the_kustomization_lists_every_manifest_of_its_directory():
    listed = yaml.safe_load((SCALE_OUT / "kustomization.yaml").read_text())["resources"]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in SCALE_OUT.glob("*.y*ml")} - {"kustomization.yaml"}


def test_every_object_is_valid(objects):
    assert set(objects) == BUILTIN_KINDS | set(CUSTOM_SCHEMAS) | {"ScaledObject"}
    assert "PersistentVolumeClaim" not in objects  # the kafka store needs no volume
    for kind, doc in objects.items():
        assert "namespace" not in doc["metadata"], kind
        if kind in BUILTIN_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        elif kind in CUSTOM_SCHEMAS:
            jsonschema.validate(doc, CUSTOM_SCHEMAS[kind])


@pytest.mark.parametrize("name", COPIES)
def test_monitoring_manifests_are_copies_of_the_base(name):
    assert (SCALE_OUT / name).read_text() == (MANIFESTS / name).read_text(), (
        f"scale-out/{name} differs from the base's: copy it (prometheusrule.yaml: `python -m tests.deploy.test_kubernetes`)"
    )


def test_images_and_release_label_block_are_the_bases():
    ours, theirs = ((d / "kustomization.yaml").read_text() for d in (SCALE_OUT, MANIFESTS))
    assert yaml.safe_load(ours)["images"] == yaml.safe_load(theirs)["images"]
    marker = "UNCOMMENT for kube-prometheus-stack"
    assert commented_block(ours, marker) == commented_block(theirs, marker)


def test_configmap_is_the_bases_in_partition_scope(objects, base, settings):
    ours, theirs = objects["ConfigMap"]["data"], base["ConfigMap"]["data"]
    assert {k: v for k, v in ours.items() if k not in PARTITION_SCOPE_SETTINGS} == {
        k: v for k, v in theirs.items() if k not in PARTITION_SCOPE_SETTINGS
    }
    assert objects["ConfigMap"]["metadata"] == base["ConfigMap"]["metadata"]
    assert settings.model_scope == "partition"
    assert settings.state_store == "kafka", "every pod must read every replica's checkpoints"
    assert f"{ENV_PREFIX}STATE_DIR" not in ours  # no local store, nothing mounted there
    assert settings.mix_every > 0 and settings.mix_topic != settings.checkpoint_topic
    # the service creates the input topic with the partitions the pods split, and the compacted topics
    assert settings.create_topics and settings.topic_partitions > 1


def test_deployment_is_the_bases_with_pods_a_rolling_update_and_no_state_volume(objects, base):
    deployment = objects["Deployment"]
    spec = deployment["spec"]
    expected = copy.deepcopy(base["Deployment"])
    expected["spec"]["replicas"] = 3
    expected["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    pod = expected["spec"]["template"]["spec"]
    [state] = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    pod["volumes"].remove(state)
    for container in pod["containers"]:
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != state["name"]]
    pod["topologySpreadConstraints"] = spec["template"]["spec"]["topologySpreadConstraints"]
    assert deployment == expected
    for constraint in pod["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    # the only writable path is /tmp, an emptyDir
    assert [list(v) for v in pod["volumes"]] == [["name", "emptyDir"]]
    assert "persistentVolumeClaim" not in json.dumps(objects)


def test_pod_disruption_budget_evicts_one_pod_at_a_time(objects):
    pdb, deployment = objects["PodDisruptionBudget"], objects["Deployment"]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert (
        pdb["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


# --------------------------------------------------------------------------- the ScaledObject

# The fields of KEDA's ScaledObject CRD (keda.sh/v1alpha1) these manifests use, with
# the CRD's types; closed, so a misspelled field fails here instead of being ignored.
# Trigger metadata values are strings in the CRD (lagThreshold: "1000", not 1000).
SCALEDOBJECT_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": SERVICEMONITOR_SCHEMA["properties"]["metadata"],
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string"}, "behavior": {"type": "object"}},
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_scaledobject_structure(objects):
    scaled = objects["ScaledObject"]
    jsonschema.validate(scaled, SCALEDOBJECT_SCHEMA)
    for mutate in (
        lambda s: s["spec"]["triggers"][0]["metadata"].__setitem__("lagThreshold", 1000),  # not a string
        lambda s: s["spec"].__setitem__("maxReplicas", 6),
    ):  # the HPA's name, not KEDA's
        broken = copy.deepcopy(scaled)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, SCALEDOBJECT_SCHEMA)
    # KEDA hands the behaviour to the HorizontalPodAutoscaler it makes: valid there
    spec = scaled["spec"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-perceptron-stream"},
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicaCount"],
            "maxReplicas": spec["maxReplicaCount"],
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
        },
    }
    kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)


def test_scaledobject_scales_the_deployment_on_its_groups_lag(objects, settings):
    spec, deployment = objects["ScaledObject"]["spec"], objects["Deployment"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    [trigger] = spec["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == settings.group_id
    assert meta["topic"] == settings.input_topic
    assert meta["bootstrapServers"] == settings.bootstrap_servers
    assert meta["offsetResetPolicy"] == settings.auto_offset_reset  # a new group's lag counts what it will read
    # KEDA reads committed offsets, which move only at checkpoints: a pod that keeps up shows up to a checkpoint
    # interval of lag, and a threshold below that scales out on the checkpoints' sawtooth alone
    assert int(meta["lagThreshold"]) >= 2 * settings.checkpoint_interval_events
    assert meta.get("allowIdleConsumers", "false") == "false"
    assert settings.security_protocol == "PLAINTEXT" or "authenticationRef" in trigger


def test_pods_never_outnumber_the_input_partitions(objects, settings):
    spec = objects["ScaledObject"]["spec"]
    assert spec["minReplicaCount"] == 1
    assert spec["minReplicaCount"] <= objects["Deployment"]["spec"]["replicas"] <= spec["maxReplicaCount"]
    # at most the partition count the service creates the input topic with (one replica per partition) ...
    assert spec["maxReplicaCount"] == settings.topic_partitions
    # ... and the file says why
    text = (SCALE_OUT / "scaledobject.yaml").read_text()
    assert "Must not exceed the input topic's partition count" in text.split("maxReplicaCount:")[0]
