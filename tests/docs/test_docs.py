"""The documentation site (docs/, mkdocs.yml) stays true to the code and builds strictly.

- every ```python example of the docs runs (``>>>`` examples as doctests, the others executed); one whose marker
  says it needs a running broker runs against one in tests/integration/test_docs_examples.py;
- every ```sh example of the docs and README runs (``train``) or is parsed with its command's settings;
- the reference pages are generated from the code: every setting of every command with its flag, environment
  variable, readable type and default; a settings class's description is what the table shows; the generated
  parts are committed in the pages, and are what the code generates now (``python docs/reference.py --write``);
- every metric the service exports is on the metrics page;
- ``mkdocs build --strict`` fails on a broken link (tests/run.sh runs the build before the tests).
"""

from __future__ import annotations

import doctest
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from perceptron_stream.cli import COMMANDS
from perceptron_stream.config import CommandSettings, ConfigError, ServeSettings, env_var, flag, load
from perceptron_stream.metrics import ServiceMetrics
from pydantic import Field

from tests.support.docs import (
    DOCS,
    MKDOCS_YML,
    README,
    ROOT,
    Example,
    ShellExample,
    commands_of,
    python_examples,
    reference_hook,
    shell_examples,
    try_commands,
    write_config_files,
)

EXAMPLES = python_examples()
reference = reference_hook()


# -- the examples run -------------------------------------------------------------------------------------------


def test_the_docs_have_examples_to_run_and_say_why_one_is_skipped() -> None:
    assert sum(not example.skipped for example in EXAMPLES) >= 3, [example.name for example in EXAMPLES]
    for example in EXAMPLES:
        if example.skipped:  # a skipped example must need what a unit test has not: a broker
            assert any(client in example.code for client in ("KafkaProducer", "KafkaConsumer", "KafkaAdminClient")), (
                example.name
            )


@pytest.mark.parametrize("example", [e for e in EXAMPLES if not e.skipped], ids=lambda e: e.name)
def test_python_example_runs(example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    if ">>> " in example.code:
        test = doctest.DocTestParser().get_doctest(example.code, {}, example.name, str(example.page), example.line)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test)
        assert runner.failures == 0, f"{example.name}: {runner.failures} of {runner.tries} examples failed"
    else:
        exec(compile(example.code, example.name, "exec"), {"__name__": "__docs__"})


def test_a_wrong_doctest_example_fails() -> None:
    """The doctest run above can fail: an example whose output differs is counted."""
    wrong = ">>> 1 + 1\n3\n"
    test = doctest.DocTestParser().get_doctest(wrong, {}, "wrong", "wrong.md", 0)
    runner = doctest.DocTestRunner()
    runner.run(test, out=lambda _text: None)
    assert runner.failures == 1


# -- the reference is generated from the code -------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_setting_of_every_command_is_in_the_generated_reference(command: str) -> None:
    table = reference.settings_table(command)
    for field_name, field in COMMANDS[command][0].model_fields.items():
        name = field.alias or field_name  # the setting as spelled (explain's --json)
        row = next((line for line in table.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, (command, name)
        assert f"| `{flag(name)}` | `{env_var(name)}` |" in row, row
        assert "{" not in row.split("|")[4], row  # readable types, not argparse's {Path,null}
        if field.is_required():
            assert "| required |" in row, row
        elif field.default is not None and not isinstance(field.default, Path):
            assert f"`{field.default}`" in row, row


def test_the_reference_page_asks_for_every_command() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    cli = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    for command in COMMANDS:
        assert f"<!-- generated: settings {command} -->" in page, command
        assert f"<!-- generated: help {command} -->" in cli, command


def test_the_table_shows_what_the_settings_class_says() -> None:
    class Example(CommandSettings):
        retries: int = Field(3, gt=0, le=10, description="How often to try | again.")
        store: Path | None = Field(None, description="Where the *state* goes.")

    table = reference.settings_table_of(Example)
    assert (
        "| `retries` | `--retries` | `PERCEPTRON_STREAM_RETRIES` | integer, > 0, ≤ 10 | `3` | How often to try \\| again. |"
        in table
    )
    assert (
        "| `store` | `--store` | `PERCEPTRON_STREAM_STORE` | path (optional) | — | Where the \\*state\\* goes. |"
        in table
    )


def test_defaults_under_the_home_directory_are_shown_from_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed pages are the same wherever they are generated: the state directory's default is shown where
    it is without $XDG_STATE_HOME, and ``--help`` is printed with a stand-in home, wrapped the same."""
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    monkeypatch.setenv("COLUMNS", "40")
    table = reference.settings_table("serve")
    row = next(line for line in table.splitlines() if line.startswith("| `state_dir` |"))
    assert "| `~/.local/state/perceptron-stream` |" in row, row
    help_text = reference.command_help("serve")
    assert "(default: ~/.local/state/perceptron-stream)" in help_text, help_text
    assert str(Path.home()) + "/" not in help_text and "/srv/state" not in help_text


def test_help_and_schemas_are_generated() -> None:
    assert "usage: perceptron-stream serve" in reference.command_help("serve")
    prediction = reference.schema_section("prediction")
    assert "| `y_pred` |" in prediction and "schemas/prediction.schema.json" in prediction


def test_an_unknown_marker_fails_the_build() -> None:
    with pytest.raises(reference.UnknownMarker):
        reference.render("<!-- generated: settings serv -->\n")
    with pytest.raises(reference.UnknownMarker):
        reference.render("<!-- generated: table serve -->\n")


def test_the_committed_reference_is_what_the_code_generates() -> None:
    """The generated parts live in the committed pages (they read on GitHub and in an editor): regenerated from the
    code now, every page is unchanged."""
    assert [page.name for page in reference.pages()] == ["cli.md", "configuration.md", "messages.md"]
    stale = [str(page.relative_to(ROOT)) for page in reference.stale_pages()]
    assert not stale, f"{', '.join(stale)}: the generated parts differ from the code: run {reference.WRITE}"
    for page in reference.pages():
        text = page.read_text(encoding="utf-8")
        assert text.count("<!-- generated:") == text.count("<!-- end generated -->") > 0, page


def test_a_stale_page_is_found_and_rewritten_and_a_new_marker_filled(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "reference", docs / "reference")
    page = docs / "reference" / "configuration.md"
    committed = page.read_text(encoding="utf-8")
    stale = committed.replace("| Kafka consumer group. |", "| Some group. |")
    new = "# New\n\nText before.\n\n<!-- generated: help broker -->\n\nText after.\n"
    assert stale != committed
    page.write_text(stale, encoding="utf-8")
    (docs / "new.md").write_text(new, encoding="utf-8")
    assert reference.stale_pages(docs) == [docs / "new.md", page]

    assert reference.write_pages(docs) == [docs / "new.md", page]
    assert page.read_text(encoding="utf-8") == committed  # nothing else of the page changed
    written = (docs / "new.md").read_text(encoding="utf-8")
    assert written.startswith(
        "# New\n\nText before.\n\n<!-- generated: help broker -->\n\n"
        f"<!-- --help as printed by Python {reference.PYTHON} -->\n\n```text\nusage:"
    )
    assert written.endswith("```\n\n<!-- end generated -->\n\nText after.\n"), written
    assert reference.stale_pages(docs) == [] and reference.write_pages(docs) == []


def test_help_printed_by_another_python_is_up_to_date_with_the_same_words_only() -> None:
    """argparse lays --help out differently from one Python to the next; the project runs on 3.11 and later, so a
    page printed by another one passes the check (and the strict build) with the same options and words, and fails
    it with a word changed; printed by the Python running, it is compared to the letter."""
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert reference.up_to_date(page)  # as committed, whichever Python printed it
    here = reference.render(page)  # as the Python running prints it
    assert f"<!-- --help as printed by Python {reference.PYTHON} -->" in here and reference.up_to_date(here)
    elsewhere = here.replace(f"Python {reference.PYTHON}", "Python 3.99")
    assert reference.up_to_date(elsewhere.replace("--count INT", "--count   INT", 1))  # laid out otherwise
    assert not reference.up_to_date(elsewhere.replace("--count INT", "--counts INT", 1))  # another word
    assert not reference.up_to_date(here.replace("--count INT", "--count   INT", 1))  # here: to the letter


def test_the_regeneration_command_checks_and_says_what_to_run() -> None:
    proc = subprocess.run(
        [sys.executable, str(DOCS / "reference.py"), "--check"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    stale = "# T\n\n<!-- generated: help broker -->\n\nstale\n\n<!-- end generated -->\n"
    with pytest.raises(reference.StalePage, match=r"t\.md: .* run python docs/reference\.py --write"):
        reference.on_page_markdown(stale, SimpleNamespace(file=SimpleNamespace(src_uri="t.md")), None, None)
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    # the hook leaves a committed page as it is: the build inserts nothing a second time
    assert reference.on_page_markdown(page, SimpleNamespace(file=SimpleNamespace(src_uri="cli.md")), None, None) == page


def test_an_end_marker_without_its_marker_is_refused() -> None:
    with pytest.raises(reference.UnknownMarker, match="end generated"):
        reference.render("text\n<!-- end generated -->\n")
    with pytest.raises(reference.UnknownMarker, match="is no marker"):
        reference.render("<!-- generated: settings Serve -->\n")


# -- operations -------------------------------------------------------------------------------------------------


def test_every_service_metric_is_on_the_metrics_page() -> None:
    page = (DOCS / "operations" / "metrics.md").read_text(encoding="utf-8")
    names = {
        m.name
        for m in ServiceMetrics(window=10, version="t", variant="plain").registry.collect()
        if m.name.startswith("perceptron_")
    }
    assert names
    for name in names:
        # counters are exposed with _total, infos with _info
        assert any(f"`{name}{suffix}`" in page for suffix in ("", "_total", "_info")), name


# -- the build is strict ----------------------------------------------------------------------------------------


def _build_a_copy(tmp_path: Path, change: Callable[[Path], None]) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of a copy of the site, changed by ``change`` (given the copy's docs/)."""
    work = tmp_path / "repo"
    shutil.copytree(DOCS, work / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(MKDOCS_YML, work / "mkdocs.yml")
    change(work / "docs")
    # the hook and the snippets read the checkout's service/, schemas/ and bench/: the copy links to them
    for name in ("service", "schemas", "bench"):
        (work / name).symlink_to(ROOT / name)
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_mkdocs_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """tests/run.sh runs ``mkdocs build --strict``: a link to a page that does not exist fails it."""

    def broken_link(docs: Path) -> None:
        (docs / "index.md").write_text((DOCS / "index.md").read_text() + "\n[gone](no-such-page.md)\n")

    proc = _build_a_copy(tmp_path, broken_link)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "no-such-page.md" in proc.stderr, proc.stderr


def test_mkdocs_build_shows_each_generated_part_once(tmp_path: Path) -> None:
    """The pages hold their generated parts and the hook inserts nothing (a stale page fails it: the hook's test
    above)."""
    proc = _build_a_copy(tmp_path, lambda docs: None)
    assert proc.returncode == 0, proc.stderr
    site = tmp_path / "site" / "reference"
    assert (site / "configuration" / "index.html").read_text().count("PERCEPTRON_STREAM_MIX_EVERY") == 1
    assert (site / "cli" / "index.html").read_text().count("usage: perceptron-stream serve ") == 1


def test_the_hooks_own_examples() -> None:
    result = doctest.testmod(reference)
    assert result.attempted > 0 and result.failed == 0, result


# -- the shell examples run, as far as they can without brokers --------------------------------------------------

SHELL = shell_examples()


@pytest.mark.parametrize("example", SHELL, ids=lambda e: e.name)
def test_shell_example_runs_or_parses(example: ShellExample, tmp_path: Path) -> None:
    """``perceptron-stream train`` runs, every other ``perceptron-stream`` command line is parsed with its settings
    (a flag that does not exist, a value out of range, a file not made by the lines before it fail here)."""
    write_config_files(example.page, tmp_path)  # a settings file the page shows, as the reader saves it
    done = try_commands(example, tmp_path)
    wanted = [
        command for _, command in commands_of(example) if command[0] in ("perceptron-stream", "printf", "head", "chmod")
    ]
    assert len(done) == len(wanted), (example.name, done)


def test_the_shell_examples_are_checked_and_a_wrong_flag_fails(tmp_path: Path) -> None:
    ran = []
    for i, example in enumerate(SHELL):
        (tmp_path / str(i)).mkdir()
        write_config_files(example.page, tmp_path / str(i))
        ran += try_commands(example, tmp_path / str(i))
    assert sum(entry.startswith("ran perceptron-stream train") for entry in ran) >= 2, ran
    assert sum(entry.startswith("parsed perceptron-stream serve") for entry in ran) >= 5, ran
    env = ShellExample(ROOT / "README.md", 1, "PERCEPTRON_STREAM_BATCH_SIZE=0 perceptron-stream serve")
    with pytest.raises(ConfigError, match="batch_size"):
        try_commands(env, tmp_path)
    wrong = ShellExample(ROOT / "README.md", 1, "perceptron-stream serve --no-such-flag 1")
    with pytest.raises(ConfigError, match="no-such-flag"):
        try_commands(wrong, tmp_path)


def test_a_settings_file_a_page_shows_is_the_command_s_settings(tmp_path: Path, monkeypatch) -> None:
    """security.md's serve.toml, with the password from the environment as the page says: what serve would run with."""
    from perceptron_stream.config import ServeSettings, load

    assert write_config_files(DOCS / "how-to" / "security.md", tmp_path) == ["serve.toml"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERCEPTRON_STREAM_SASL_PASSWORD", "secret")
    settings = load(ServeSettings, ["--config-file", "serve.toml"])
    assert (settings.security_protocol, settings.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert settings.sasl_password is not None and settings.sasl_password.get_secret_value() == "secret"


WALKED = [README, *sorted((DOCS / "getting-started").glob("*.md")), *sorted((DOCS / "how-to").glob("*.md"))]
WALKED += [DOCS / "concepts" / "delayed-labels.md", DOCS / "concepts" / "learner.md"]


def test_the_pages_serve_commands_share_a_group_only_with_the_same_model() -> None:
    """Copied in order on one machine, the pages' ``serve`` commands meet in a consumer group, and so in its
    checkpoints (``<state dir>/<group>``), only where they run the same model on the same topics (a model of other
    settings stops on another's checkpoints; one on another input learns other events from the group's positions),
    and two models never publish on one output topic (tests/integration/test_docs_examples.py walks the pages)."""
    models: dict[str, dict[tuple, str]] = {}
    for example in shell_examples(WALKED):
        for _env, command in commands_of(example):
            if command[:2] != ["perceptron-stream", "serve"] or "--config-file" in command:
                continue  # a settings file is for other brokers (security.md's, on a host of their own)
            files = {
                flag: command[i + 1]
                for i, flag in enumerate(command)
                if flag in ("--initial-model", "--checkpoint-key-file")
            }
            args = [word for word in command[2:] if word not in files and word not in files.values()]
            s = load(ServeSettings, args)
            model = (
                s.input_topic,
                s.output_topic,
                s.variant,
                s.standardize,
                s.margin,
                s.challengers,
                s.hash_features,
                s.label_topic,
                s.learning,
                tuple(sorted(files.items())),
            )
            models.setdefault(s.group_id, {}).setdefault(model, example.name)
    for group, of_group in models.items():
        assert len(of_group) == 1, f"group {group}: {of_group}"
    assert len(models) >= 6, models  # the pages' models: README's, two measured, warm start's, ...
    outputs = [model[1] for of_group in models.values() for model in of_group]
    assert len(outputs) == len(set(outputs)), outputs
