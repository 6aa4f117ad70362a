"""What the tests of the documentation site share: the site's address, its pages, their Python examples, and the
generator of the reference pages' parts (docs/reference.py, loaded by path as mkdocs loads it)."""

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


SHELL_FENCE = re.compile(r"```sh\n(?P<code>.*?)\n```", re.DOTALL)
README = ROOT / "README.md"


@dataclass(frozen=True)
class ShellExample:
    page: Path
    line: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def shell_examples(pages: list[Path] | None = None) -> list[ShellExample]:
    """Every ```sh block of README.md and the docs' pages (or of ``pages``)."""
    found = []
    for page in pages if pages is not None else [README, *sorted(DOCS.rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for match in SHELL_FENCE.finditer(text):
            found.append(ShellExample(page, text.count("\n", 0, match.start("code")) + 1, match["code"]))
    return found


def commands_of(example: ShellExample) -> list[tuple[dict[str, str], list[str]]]:
    """The commands of a block in order, each as the environment its line sets (``NAME=value cmd``) and its
    arguments: a line's ``$ `` prompt, its trailing ``&`` and its comment left out, ``a && b`` as two commands."""
    import shlex

    commands = []
    for line in example.code.splitlines():
        words = shlex.split(line.strip().removeprefix("$ "), comments=True)
        if words and words[-1] == "&":
            words = words[:-1]
        command: list[str] = []
        for word in [*words, "&&"]:
            if word != "&&":
                command.append(word)
                continue
            env = {}
            while command and "=" in command[0] and command[0].split("=", 1)[0].isupper():
                name, value = command.pop(0).split("=", 1)
                env[name] = value
            if command:
                commands.append((env, command))
            command = []
    return commands


TOML_FENCE = re.compile(r"```toml\n# (?P<name>\S+)\n(?P<code>.*?)\n```", re.DOTALL)


def write_config_files(page: Path, cwd: Path) -> list[str]:
    """The settings files a page shows (a ```toml block whose first line is ``# <file name>``), written into ``cwd``
    for its shell examples, with an empty stand-in for each file they name (``ssl_cafile = "kafka-ca.pem"``)."""
    import tomllib

    written = []
    for match in TOML_FENCE.finditer(page.read_text(encoding="utf-8")):
        (cwd / match["name"]).write_text(match["code"])
        for key, value in tomllib.loads(match["code"]).items():
            if key.endswith("file") and isinstance(value, str) and not Path(value).is_absolute():
                (cwd / value).touch()
        written.append(match["name"])
    return written


def try_commands(example: ShellExample, cwd: Path) -> list[str]:
    """Run what of a shell example can run on its own, in ``cwd``; return what was done, one entry a command.

    ``printf FMT > FILE`` writes the file, ``head`` and ``chmod`` run (a key file made of random bytes);
    ``perceptron-stream train`` runs; every other ``perceptron-stream``
    command is parsed with its settings, as it would be at start-up (its flags, values and files checked), but
    not run, since it needs brokers, with the environment the line sets; other programs (pip, docker, kubectl)
    are left alone.
    """
    import contextlib
    import io
    import os
    import subprocess

    from perceptron_stream.cli import COMMANDS, main
    from perceptron_stream.config import load

    done = []
    for env, command in commands_of(example):
        if command[0] == "printf":
            assert command[2] == ">" and len(command) == 4, command
            (cwd / command[3]).write_text(command[1].encode().decode("unicode_escape"))
            done.append(f"wrote {command[3]}")
        elif command[0] in ("head", "chmod"):  # plain words only: the line as it is, with its pipe and redirection
            subprocess.run(["bash", "-c", " ".join(command)], cwd=cwd, check=True, timeout=60)
            done.append("ran " + " ".join(command))
        elif command[0] == "perceptron-stream":
            name, args = command[1], command[2:]
            if name == "model":
                assert args[:1] == ["export"], command
                args = args[1:]
            before, here = dict(os.environ), Path.cwd()
            os.environ.update(env)
            os.chdir(cwd)
            try:
                if name == "train":
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        assert main(command[1:]) == 0, command
                    done.append("ran " + " ".join(command))
                else:
                    load(COMMANDS[name][0], args)  # raises ConfigError naming the setting when a flag is wrong
                    done.append("parsed " + " ".join(command))
            finally:
                os.chdir(here)
                os.environ.clear()
                os.environ.update(before)
    return done
