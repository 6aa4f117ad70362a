"""The distribution installs one import package of the project's own name, ``perceptron_stream``, built from the
repository's ``service/`` directory; nothing called ``service`` reaches site-packages
(the wheel built from the image's context is checked in tests/deploy/test_compose.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.support import ROOT


def _declared() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_every_package_directory_is_declared():
    """setuptools cannot find packages under another name, so pyproject lists them: a new one must be added."""
    on_disk = {
        ".".join(("perceptron_stream", *init.parent.relative_to(ROOT / "service").parts))
        for init in (ROOT / "service").rglob("__init__.py")
    }
    assert on_disk == set(_declared())


def test_python_dash_m_runs_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "perceptron_stream", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("perceptron-stream ")
