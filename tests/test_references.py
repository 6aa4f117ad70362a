"""Names of this project quoted in comments, docstrings and the docs still name something.

A comment that names ``perceptron_stream.app._points_first`` after that function moved sends the next reader to
nothing (issue 34 found three such). Checked, in the comments and docstrings of service/ and tests/ and in the
Markdown of docs/ and README.md:

- a dotted name ``perceptron_stream.x.y`` imports as a module and its attributes (a class's method included);
- a repository path (``service/kafka/kp_mends.py``, ``tests/integration/``) exists, or begins the name of what
  does (``tests/test_<module>.py`` written as ``tests/test_``), or lies where git ignores what runs write.

Code is left to the interpreter, the linters and mypy; strings in code may name what is not there on purpose (a
test's fake paths). bench/ is left out: it measures older trees too (its fallbacks import their modules), and
bench/README.md records dated measurements in the words of the code as it was then.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"(?<![\w./-])perceptron_stream(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])((?:service|tests|bench|docs|deploy|schemas)/[\w./-]*\w)")


def prose(path: Path) -> str:
    """What people read of a file: a Python file's comments and docstrings, a Markdown page whole."""
    text = path.read_text()
    if path.suffix == ".md":
        return text
    comments = [
        token.string for token in tokenize.generate_tokens(io.StringIO(text).readline) if token.type == tokenize.COMMENT
    ]
    docstrings = [
        ast.get_docstring(node, clean=False) or ""
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    return "\n".join(comments + docstrings)


def unknown(text: str, ignored: list[str]) -> list[str]:
    """The names quoted in ``text`` that name nothing."""
    names = [m[0] for m in DOTTED.finditer(text) if not resolves(m[0])]
    return names + [m[1].rstrip(".") for m in PATH.finditer(text) if not exists(m[1].rstrip("."), ignored)]


def resolves(dotted: str) -> bool:
    """Whether the longest importable prefix of ``dotted`` has the rest as attributes, one after another."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def ignored_dirs() -> list[str]:
    """The repository's directories that .gitignore keeps out (what runs write: bench/results/, site/)."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [line.strip("/") + "/" for line in lines if line.endswith("/") and "*" not in line]


def exists(path: str, ignored: list[str]) -> bool:
    """Whether ``path`` is in the repository, is where git ignores what runs write, or (with no suffix: a pattern
    such as ``tests/test_``) begins a name in its folder."""
    if (ROOT / path).exists() or any(f"{path}/".startswith(d) for d in ignored):
        return True
    parent, _, stem = path.rpartition("/")
    return (
        "." not in stem and (ROOT / parent).is_dir() and any(p.name.startswith(stem) for p in (ROOT / parent).iterdir())
    )


def stale_references(paths: list[Path], base: Path = ROOT) -> dict[str, list[str]]:
    """Each quoted name that names nothing → the files that quote it (relative to ``base``)."""
    ignored, stale = ignored_dirs(), dict[str, list[str]]()
    for path in paths:
        if not unknown(path.read_text(), ignored):  # (the whole file first: parsing every file costs seconds)
            continue
        for name in unknown(prose(path), ignored):
            stale.setdefault(name, []).append(str(path.relative_to(base)))
    return stale


def checked_files() -> list[Path]:
    python = [p for folder in ("service", "tests") for p in sorted((ROOT / folder).rglob("*.py"))]
    python.remove(Path(__file__).resolve())  # this module quotes names gone, as examples
    return [*python, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def test_quoted_names_of_the_project_name_something():
    assert stale_references(checked_files()) == {}


def test_a_name_gone_is_caught_and_code_is_not_read(tmp_path):
    """The check itself: a moved function in a comment, a docstring and a page is caught; the same in code is not."""
    module = tmp_path / "module.py"
    module.write_text(
        '"""Held by perceptron_stream.app._points_first (see service/app.py and service/gone.py)."""\n'
        "# perceptron_stream.runtime.partitions.OneInstance.check pauses; perceptron_stream.app._check_group no more\n"
        'FAKE = "perceptron_stream.not_a_module and tests/x/y.py in a string of code"\n'
    )
    page = tmp_path / "page.md"
    page.write_text("`perceptron_stream.kafka.kp_mends.require_mends`, `perceptron_stream.schema.FirstErrorOnly`\n")
    found = {name: len(files) for name, files in stale_references([module, page], tmp_path).items()}
    assert found == {
        "perceptron_stream.app._points_first": 1,
        "service/gone.py": 1,
        "perceptron_stream.app._check_group": 1,
        "perceptron_stream.schema.FirstErrorOnly": 1,
    }
