"""README.md stays what it is, and true: what the product does, the two commands, a short tour and links to the site.

The reference (settings, commands, metrics, message formats) lives on the documentation site, generated from the
code and tested in tests/docs; this checks README's own claims: its test command is CI's, its links lead to pages
that exist, its examples run (the Python one) or parse (the command lines: tests/docs runs every page's), and what
it says of the demo's settings against `serve`'s defaults is what the code does.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from perceptron_stream.config import DemoSettings, ProduceSettings, ServeSettings, load

from tests.support import ROOT
from tests.support.docs import DOCS, README, mkdocs_config, shell_examples, try_commands

TEXT = README.read_text(encoding="utf-8")
LINKS = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", TEXT)


def test_the_readme_is_a_screen_or_two_not_the_manual():
    assert len(TEXT.splitlines()) <= 150


def test_the_test_command_is_the_one_ci_runs_in_a_fresh_virtual_environment():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    made, entered = commands.index('python3 -m venv "$venv"'), commands.index('. "$venv/bin/activate"')
    installed = commands.index("python3 -m pip install --quiet --disable-pip-version-check .")
    assert made < entered < installed < commands.index("bash tests/run.sh -q")  # in that order, in the venv
    assert 'venv=$(mktemp -d "${TMPDIR:-/tmp}/' in ci  # outside the checkout
    assert "\nbash tests/run.sh " in TEXT  # a command line of its own
    assert "pip install . && perceptron-stream demo" in TEXT and "python3 -m venv .venv" in TEXT
    assert "`bash tests/run.sh -q`" in TEXT and ".ci/run" in TEXT  # and it says what CI runs


def test_the_install_says_what_to_do_where_pip_refuses_outside_a_virtual_environment():
    flat = " ".join(TEXT.split())
    assert "PEP 668" in flat and "Debian 12" in flat and "Ubuntu 24.04" in flat
    assert "python3 -m venv" in flat and "pipx install ." in flat


def test_every_link_leads_to_a_file_of_the_repository():
    local = [link for link in LINKS if not link.startswith(("http://", "https://"))]
    assert len(local) >= 20, local
    for link in local:
        assert (ROOT / link).is_file(), link


def test_every_page_of_the_site_but_the_runbooks_is_linked():
    """The runbooks have their index; every other page of the site's navigation is one click from README."""

    def pages(nav) -> list[str]:
        found: list[str] = []
        for entry in nav:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            found += pages(value) if isinstance(value, list) else [value]
        return found

    linked = {str(Path(link).relative_to("docs")) for link in LINKS if link.startswith("docs/")}
    for page in pages(mkdocs_config()["nav"]):
        if page.startswith("operations/runbooks/") and page != "operations/runbooks/index.md":
            continue
        if page == "performance/benchmarks.md":  # bench/README.md included whole: README links that file
            assert "bench/README.md" in LINKS
            continue
        assert page in linked, page
        assert (DOCS / page).is_file(), page


def test_the_python_example_runs():
    [block] = re.findall(r"```python\n(.*?)\n```", TEXT, re.DOTALL)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["model"].predict_one({"age": 45, "salary": 31000}) in (-1, 1)


@pytest.mark.parametrize("example", shell_examples([README]), ids=lambda e: e.name)
def test_the_command_lines_parse(example, tmp_path):
    assert try_commands(example, tmp_path)


def _tour() -> tuple[ServeSettings, ProduceSettings]:
    lines = [shlex.split(line, comments=True) for line in TEXT.splitlines() if line.startswith("perceptron-stream ")]
    commands = {words[1]: words[2:] for words in lines if words[1] in ("serve", "produce")}
    return load(ServeSettings, commands["serve"]), load(ProduceSettings, commands["produce"])


def test_the_tour_runs_the_demo_s_model_and_stream_and_says_the_defaults_differ():
    serve, produce = _tour()
    demo = DemoSettings()
    assert (serve.variant, serve.standardize) == (demo.variant, demo.standardize) == ("averaged", True)
    assert (produce.stream, produce.noise, produce.rate, produce.count) == ("credit", demo.noise, demo.rate, 0)
    defaults = ServeSettings()
    assert (defaults.variant, defaults.standardize) == ("plain", False)  # what README says serve starts with
    flat = " ".join(TEXT.split())
    assert "`serve`'s defaults are not the demo's" in flat and "(`--variant plain`, no `--standardize`)" in flat
    # the figures are those of the stream without the bank's policy change (the walk in
    # tests/integration/test_docs_examples.py measures them with these lines)
    assert produce.drift_every >= 1_000_000 and "without the bank's policy change" in flat
    # the same two lines are on the site's page, where the figures are measured
    page = (DOCS / "getting-started" / "own-kafka.md").read_text()
    for line in TEXT.splitlines():
        if line.startswith(("perceptron-stream serve ", "perceptron-stream produce ")):
            assert line.replace("kafka:9092", "host:9092") in page, line
