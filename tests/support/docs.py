"""What the tests of the documentation site share: the site's address, its pages, their Python examples, and the
hook that generates the reference pages (docs/reference.py, loaded by path as mkdocs loads it)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
RUNBOOKS = DOCS / "operations" / "runbooks"
FENCE = re.compile(r"(?P<skip><!-- docs-test: skip \([^)]+\) -->\n)?```python\n(?P<code>.*?)\n```", re.DOTALL)


def mkdocs_config() -> dict:
    # mkdocs.yml holds no Python tags, so the safe loader reads it
    return yaml.safe_load(MKDOCS_YML.read_text(encoding="utf-8"))


def site_url() -> str:
    return mkdocs_config()["site_url"]


def runbook_url(alert: str) -> str:
    """Where an alert's runbook is on the site: its page docs/operations/runbooks/<alert>.md, as mkdocs builds it."""
    return f"{site_url()}operations/runbooks/{alert}/"


def runbook_page(alert: str) -> Path:
    return RUNBOOKS / f"{alert}.md"


def reference_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    code: str
    skipped: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def python_examples() -> list[Example]:
    """Every ```python block of the docs' pages, with where it is and whether a marker keeps it from running."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            found.append(
                Example(page, text.count("\n", 0, match.start("code")) + 1, match["code"], bool(match["skip"]))
            )
    return found
