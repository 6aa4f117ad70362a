"""What the deploy checks share: where the manifests and the Dockerfile are, how they read them,
and the structural schemas of the Prometheus Operator's custom resources.

kubernetes-validate has no schema for custom resources, so the ServiceMonitor
and PrometheusRule (monitoring.coreos.com/v1) are checked against the fields
these manifests use, as the operator's CRDs define them: closed, so a
misspelled field fails a test instead of being ignored by the operator.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from perceptron_stream.config import ENV_PREFIX, ServeSettings, load

from tests.support import ROOT

MANIFESTS = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
KUBERNETES_VERSION = "1.30.0"


def documents(path: Path) -> list[dict]:
    """The YAML documents of ``path``, empty ones left out."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def dockerfile_env() -> dict[str, str]:
    """The image's ENV (continuation lines joined), the base the container's env overrides."""
    env: dict[str, str] = {}
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if line.upper().startswith("ENV "):
            for token in shlex.split(line[4:]):
                key, _, value = token.partition("=")
                env[key] = value
    return env


def serve_settings(monkeypatch, env: dict[str, str]) -> ServeSettings:
    """The settings the service loads from ``env`` alone (the test's own PERCEPTRON_STREAM_* variables removed)."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load(ServeSettings, [])


_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"  # the CRDs' pattern
)
#: The fields of the ServiceMonitor CRD (prometheus-operator, monitoring.coreos.com/v1) that these manifests use.
SERVICEMONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                        },
                    },
                },
            },
        },
    },
}


#: The same for the PrometheusRule CRD.
PROMETHEUSRULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": SERVICEMONITOR_SCHEMA["properties"]["metadata"],
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def commented_block(text: str, marker: str) -> str:
    """The YAML of a commented-out block: the ``# `` lines right after the line holding ``marker``, uncommented."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line) + 1
    block = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        block.append(line[2:])
    return "\n".join(block)


def kustomized_image(image: str, entries: list[dict]) -> str:
    """What kustomize's `images:` makes of a container's image (newName, newTag; no digests here)."""
    name, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:
        name, tag = image, "latest"
    for entry in entries:
        if entry["name"] == name:
            assert "digest" not in entry
            return f"{entry.get('newName', name)}:{entry.get('newTag', tag)}"
    return f"{name}:{tag}"
