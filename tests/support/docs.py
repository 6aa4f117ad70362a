"""What the tests of the documentation site share: the site's address, its pages, their Python examples, and the
generator of the reference pages' parts (docs/reference.py, loaded by path as mkdocs loads it)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
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
    from perceptron_stream.config import CommandSettings, ModelAtSettings, load

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
            settings_cls: type[CommandSettings] = COMMANDS[name][0]
            if name == "model":
                assert args[:1] in (["export"], ["at"]), command
                if args[0] == "at":  # model at VERSION: the flag --version VERSION, as the cli reads it
                    settings_cls, args = ModelAtSettings, ["--version", *args[1:]]
                else:
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
                    load(settings_cls, args)  # raises ConfigError naming the setting when a flag is wrong
                    done.append("parsed " + " ".join(command))
            finally:
                os.chdir(here)
                os.environ.clear()
                os.environ.update(before)
    return done


def block_of(page: Path, containing: str) -> ShellExample:
    """The one ```sh block of ``page`` whose text contains ``containing``."""
    [example] = [example for example in shell_examples([page]) if containing in example.code]
    return example


class Machine:
    """A newcomer's machine, on which the pages' ```sh blocks run in order as written, by bash, line after line.

    It has a home of its own (so the default state directory, ``~/.local/state/perceptron-stream``, starts empty
    and is shared by every page run on it, as it is by a reader's pages), the project's ``perceptron-stream`` on
    its PATH, and its defaults given in the environment: the default brokers (``127.0.0.1:9092`` on the pages) and
    the embedded broker's port are ``default_port``, the default metrics port (8000) is ``ports[8000]``. What a
    page writes out (``host:9092``, ``localhost:8001``, ``--metrics-port 8002``) is replaced by the test's
    (``places``, and the ports), nothing else. A line ending in ``&``, and a command a page runs "in another
    terminal" (``serve``, ``broker``, ``produce --count 0``: they run until stopped), runs in the background until
    :meth:`stop`; any other line must exit 0 (its output is returned).
    """

    def __init__(self, home: Path, default_port: int, ports: dict[int, int]):
        import os
        import shutil
        import sys

        self.home = home
        self.default_port = default_port
        self.ports = ports
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERCEPTRON_STREAM_", "XDG_"))}
        bin_dir = str(Path(sys.executable).parent)
        assert shutil.which("perceptron-stream", path=bin_dir), f"no perceptron-stream in {bin_dir}"
        self.env = {
            **env,
            "HOME": str(home),
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
            "PERCEPTRON_STREAM_BOOTSTRAP_SERVERS": f"127.0.0.1:{default_port}",
            "PERCEPTRON_STREAM_PORT": str(default_port),  # perceptron-stream broker's --port
            "PERCEPTRON_STREAM_METRICS_PORT": str(ports[8000]),
        }
        self.background: list[tuple[str, subprocess.Popen, Path]] = []
        self.logs = home / "logs"
        self.logs.mkdir(exist_ok=True)

    def place(self, text: str, places: dict[str, str]) -> str:
        """``text`` as it runs here: the page's addresses and ports replaced by the machine's."""
        for page_port, port in self.ports.items():
            for prefix in ("localhost:", "127.0.0.1:", "--metrics-port "):
                text = text.replace(f"{prefix}{page_port}", f"{prefix}{port}")
        for written, here in places.items():
            text = text.replace(written, here)
        return text.replace("127.0.0.1:9092", f"127.0.0.1:{self.default_port}")

    def default_broker_answers(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.default_port), timeout=1):
                return True
        except OSError:
            return False

    def run(self, example: ShellExample, places: dict[str, str] | None = None, timeout: float = 600) -> list[str]:
        """Run the block's lines in order; the output of each line run to its end, in order."""
        import shlex

        outputs = []
        for raw in example.code.splitlines():
            line = self.place(raw.strip().removeprefix("$ "), places or {})
            words = shlex.split(line, comments=True)
            if not words:
                continue
            background = words[-1] == "&"
            words = [w for w in words if w != "&"]
            if words[:2] == ["perceptron-stream", "broker"] and self.default_broker_answers():
                continue  # a reader keeps the broker of an earlier page running (the pages: "if it does not run yet")
            forever = words[0] == "perceptron-stream" and (
                words[1] in ("serve", "broker", "demo")
                or (words[1] == "produce" and "--count" in words and words[words.index("--count") + 1] == "0")
            )
            command = line.rstrip().removesuffix("&") if background else line
            if background or forever:
                log = self.logs / f"{len(self.background)}-{words[1] if len(words) > 1 else words[0]}.log"
                with open(log, "wb") as out:
                    process = subprocess.Popen(
                        ["bash", "-c", command],
                        cwd=self.home,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                self.background.append((line, process, log))
                continue
            done = subprocess.run(
                ["bash", "-c", command], cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
            )
            assert done.returncode == 0, f"{example.name}: {line!r} exited {done.returncode}: {done.stderr[-3000:]}"
            outputs.append(done.stdout)
        return outputs

    def check_running(self) -> None:
        """Fail, with its log, if a command left running has exited."""
        for line, process, log in self.background:
            code = process.poll()
            assert code is None, f"{line!r} exited {code}:\n{log.read_text()[-4000:]}"

    def wait_until(self, predicate, timeout: float, what: str):
        """``predicate()`` once true, failing at once when a command left running has exited."""
        from tests.support.waiting import wait_until

        def check():
            self.check_running()
            return predicate()

        return wait_until(check, timeout, interval=0.5, what=what)

    def stop(self, keep: int = 0) -> None:
        """Stop what runs in the background (Ctrl-C, as a reader does), but the first ``keep`` (a broker)."""
        import contextlib
        import os
        import signal

        for _line, process, _log in self.background[keep:]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
        for _line, process, _log in self.background[keep:]:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # it may have exited since
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.background = self.background[:keep]
