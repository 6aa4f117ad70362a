"""The reference pages' generated parts, from the code: the one home of generated documentation.

A page asks for a generated part with a marker on a line of its own; ``python docs/reference.py --write`` writes
the part after it, up to an end marker, into the page itself, so the committed Markdown reads whole on GitHub and
in an editor, not only on the built site:

- ``<!-- generated: settings serve -->``: the table of a command's settings, from its pydantic settings class in
  service/config.py (name, flag, environment variable, type, default, description);
- ``<!-- generated: help serve -->``: the output of ``perceptron-stream serve --help``;
- ``<!-- generated: schema prediction -->``: a JSON Schema of schemas/ as a table of its fields, and the schema.

Each part ends at ``<!-- end generated -->``; a new marker without one gets it on the next ``--write``.
``--check`` (and tests/docs/test_docs.py) regenerates and compares; so does the mkdocs hook (mkdocs.yml), which
fails the build on a page that is stale or asks for an unknown part, and otherwise leaves the page as committed
(nothing inserted twice). Nothing here is hand-copied: change a description in service/config.py, run
``--write``, and the reference page changes with it.

The parts are the same on every machine: ``--help`` is taken from a child process with a fixed terminal width, no
colour, no ``PERCEPTRON_STREAM_*`` variables and a stand-in home, and the state directory's default is shown as
``~/.local/state/perceptron-stream`` whatever ``$HOME`` and ``$XDG_STATE_HOME`` say where it is generated. One thing
is not the machine's to fix: argparse lays help out a little differently from one Python to the next (3.13 prints
a short option's metavar once, 3.14 can colour it), and the project runs on 3.11 and later. Each ``--help`` part
says which Python printed it; checked on another one, a part is up to date when it has the same options with the
same words (:func:`up_to_date`), so the test command passes on a newcomer's Python too.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # mkdocs loads this file by path; the service package is the checkout's
    sys.path.insert(0, str(ROOT))

from perceptron_stream.cli import COMMANDS  # noqa: E402
from perceptron_stream.config import default_state_dir, env_var, flag  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402
from pydantic_settings import BaseSettings  # noqa: E402

MARKER = re.compile(r"^<!-- generated: (?P<kind>[a-z]+) (?P<name>[a-z-]+) -->$")
END = "<!-- end generated -->"
SCHEMAS = ROOT / "schemas"
DOCS = ROOT / "docs"
WRITE = "python docs/reference.py --write"
#: The state directory's default as the pages show it: where it is when $XDG_STATE_HOME is not set.
STATE_DIR_SHOWN = "~/.local/state/perceptron-stream"
#: The home directory of the child process that prints ``--help`` (shown as ``~``): the same on every machine.
STAND_IN_HOME = "/home/you"
#: The Python running now, as a ``--help`` part names the one that printed it.
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PRINTED_BY = re.compile(r"^<!-- --help as printed by Python (\d+\.\d+) -->$", re.MULTILINE)
HELP_PART = re.compile(
    r"^<!-- --help as printed by Python \d+\.\d+ -->\n\n```text\n(.*?)\n```$", re.MULTILINE | re.DOTALL
)


class UnknownMarker(ValueError):
    """A page asks for a generated part that does not exist (a typo, or a command or schema that was removed)."""


class StalePage(ValueError):
    """A page's generated parts are not what the code generates now (or a part has no end marker yet)."""


# -- settings ---------------------------------------------------------------------------------------------------


def readable_type(annotation: Any) -> str:
    """A field's type as a reader says it, not as argparse prints it (``{Path,null}``).

    >>> from pathlib import Path; from typing import Literal
    >>> readable_type(Path | None)
    'path (optional)'
    >>> readable_type(Literal["on", "off"])
    '`on` or `off`'
    >>> readable_type(int)
    'integer'
    """
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        return f"{readable_type(rest[0])} (optional)" if len(rest) == 1 else " or ".join(map(readable_type, rest))
    if origin is typing.Literal:
        values = [f"`{value}`" for value in args]
        return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path", SecretStr: "secret"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds(metadata: list[Any]) -> str:
    """The constraints pydantic checks (``gt``, ``ge``, ``le``, ``lt``, ``min_length``), e.g. ``> 0, ≤ 100000``."""
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    parts = []
    for item in metadata:
        for attribute, sign in signs.items():
            value = getattr(item, attribute, None)
            if value is not None:
                parts.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
        length = getattr(item, "min_length", None)
        if length is not None:
            parts.append(f"at least {length} character{'s' if length != 1 else ''}")
    return ", ".join(parts)


def readable_default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "—"
    if isinstance(value, Path):
        home = str(Path.home())
        text = str(value)
        if value == default_state_dir():  # it follows $XDG_STATE_HOME where the page is generated: not the reader's
            value = STATE_DIR_SHOWN
        else:
            value = "~" + text[len(home) :] if text == home or text.startswith(home + "/") else text
    return f"`{value}`"


def _cell(text: str) -> str:
    """Text for a table cell: one line, and no character that Markdown would read as a column or as emphasis."""
    pieces = " ".join(text.split()).split("`")
    for i in range(0, len(pieces), 2):  # outside `code` spans only
        for char in "\\|*_<":
            pieces[i] = pieces[i].replace(char, "\\" + char)
    return "`".join(pieces)


def settings_table(command: str) -> str:
    """The Markdown table of one command's settings, in the order of its class."""
    if command == "model-at":  # model's second action (cli.main picks its settings)
        from perceptron_stream.config import ModelAtSettings

        return settings_table_of(ModelAtSettings)
    if command not in COMMANDS:
        raise UnknownMarker(f"no command {command!r}: one of {', '.join(COMMANDS)}")
    return settings_table_of(COMMANDS[command][0])


def settings_table_of(cls: type[BaseSettings]) -> str:
    """The Markdown table of a settings class's fields, in the order of the class."""
    rows = [
        "| setting | flag | environment variable | type | default | description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for field_name, field in cls.model_fields.items():
        name = field.alias or field_name  # (explain's --json: a field named json would shadow pydantic's method)
        kind = readable_type(field.annotation)
        if field.annotation is bool:
            kind += f" (`{flag(name)}` / `--no-{flag(name)[2:]}`)"
        limits = bounds(field.metadata)
        if limits:
            kind += f", {limits}"
        rows.append(
            f"| `{name}` | `{flag(name)}` | `{env_var(name)}` | {_cell(kind)} | {_cell(readable_default(field))} "
            f"| {_cell(field.description or '')} |"
        )
    return "\n".join(rows)


# -- command-line help ------------------------------------------------------------------------------------------


def command_help(command: str) -> str:
    """What ``perceptron-stream <command> --help`` prints, as a text block."""
    helps = help_texts()
    if command not in helps:
        raise UnknownMarker(f"no command {command!r}: one of {', '.join(COMMANDS)}")
    return f"<!-- --help as printed by Python {PYTHON} -->\n\n```text\n" + helps[command] + "\n```"


_HELPS = """
import contextlib, io, json, sys
from perceptron_stream.cli import COMMANDS, main
helps = {}
for command in ["perceptron-stream", *COMMANDS, "model-at"]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["--help"] if command == "perceptron-stream" else [*command.split("-"), "--help"])
    if code != 0:
        sys.exit(f"perceptron-stream {command} --help exited {code}")
    helps[command] = out.getvalue().rstrip()
print(json.dumps(helps))
"""


@functools.cache
def help_texts() -> dict[str, str]:
    """Every command's ``--help`` (and the program's), printed by a child process whose environment is the same on
    every machine: argparse wraps to $COLUMNS, shows the state directory's default (computed from $HOME and
    $XDG_STATE_HOME when service/config.py is imported) and colours where $FORCE_COLOR says so (Python 3.14)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PERCEPTRON_STREAM_")
        and name not in ("XDG_STATE_HOME", "FORCE_COLOR", "PYTHON_COLORS", "CLICOLOR_FORCE")
    }
    env.update(HOME=STAND_IN_HOME, COLUMNS="100", NO_COLOR="1", PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", _HELPS], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the --help of the commands could not be printed: {proc.stderr}")
    helps: dict[str, str] = json.loads(proc.stdout)
    return {command: text.replace(STAND_IN_HOME + "/", "~/") for command, text in helps.items()}


# -- message schemas --------------------------------------------------------------------------------------------


def _schema_type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in prop:
        return " or ".join(_schema_type(option, defs) for option in prop["anyOf"])
    if "enum" in prop:
        return " or ".join(f"`{json.dumps(value)}`" for value in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    kind = prop.get("type", "any")
    if kind == "array" and "items" in prop:
        return f"array of {_schema_type(prop['items'], defs)}"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"object of {_schema_type(prop['additionalProperties'], defs)}"
    return kind if isinstance(kind, str) else " or ".join(kind)


def _fields_table(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    required = set(schema.get("required", ()))
    rows = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
    for name, prop in schema.get("properties", {}).items():
        rows.append(
            f"| `{name}` | {_cell(_schema_type(prop, defs))} | {'yes' if name in required else 'no'} "
            f"| {_cell(prop.get('description', ''))} |"
        )
    return "\n".join(rows)


def schema_section(name: str) -> str:
    """A schema of schemas/ (``<name>.schema.json``): its description, its fields, its nested objects, the file."""
    path = SCHEMAS / f"{name}.schema.json"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
        raise UnknownMarker(f"no schema {path.name} in schemas/: one of {', '.join(known)}")
    schema = json.loads(path.read_text(encoding="utf-8"))
    defs = schema.get("$defs", {})
    parts = []
    if schema.get("description"):
        parts.append(" ".join(schema["description"].split()))
    parts.append(_fields_table(schema, defs))
    for def_name, definition in defs.items():
        if definition.get("properties"):
            parts.append(
                f"`{def_name}`"
                + (f": {' '.join(definition['description'].split())}" if definition.get("description") else "")
            )
            parts.append(_fields_table(definition, defs))
    parts.append(
        f'??? note "The schema: schemas/{path.name}"\n\n    ```json\n'
        + "\n".join("    " + line for line in json.dumps(schema, indent=2, ensure_ascii=False).splitlines())
        + "\n    ```"
    )
    return "\n\n".join(parts)


# -- the pages ------------------------------------------------------------------------------------------------

GENERATORS = {"settings": settings_table, "help": command_help, "schema": schema_section}


def generate(kind: str, name: str) -> str:
    generator = GENERATORS.get(kind)
    if generator is None:
        raise UnknownMarker(f"no generator {kind!r}: one of {', '.join(GENERATORS)}")
    return generator(name)


def render(markdown: str) -> str:
    """The page with every generated part as the code makes it now: after each marker a blank line, the part, a
    blank line and the end marker, in place of what stood there up to the end marker (or, for a marker that has
    none yet, inserted). Rendering a rendered page changes nothing.

    >>> once = render("# Help\\n\\n<!-- generated: help broker -->\\n")
    >>> once.endswith("```\\n\\n<!-- end generated -->\\n"), render(once) == once
    (True, True)
    """
    lines = markdown.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line == END:
            raise UnknownMarker(f"line {i + 1}: {END} without a <!-- generated: ... --> marker before it")
        match = MARKER.match(line)
        if line.startswith("<!-- generated:") and match is None:
            raise UnknownMarker(f"line {i + 1}: {line!r} is no marker: <!-- generated: KIND NAME -->")
        out.append(line)
        i += 1
        if match is None:
            continue
        part = generate(match["kind"], match["name"])
        # what stood there: up to the end marker, unless a marker or the page's end comes first (a new marker)
        j = i
        while j < len(lines) and lines[j] != END and not lines[j].startswith("<!-- generated:"):
            j += 1
        if j < len(lines) and lines[j] == END:
            i = j + 1
        out += ["", part, "", END]
    return "\n".join(out)


def pages(docs: Path = DOCS) -> list[Path]:
    """The pages with a generated part."""
    return sorted(page for page in docs.rglob("*.md") if "\n<!-- generated:" in page.read_text(encoding="utf-8"))


def _words_of_help(text: str) -> str:
    """``text`` with each ``--help`` part's layout taken out: its words in order, whitespace and the Python named
    left out (what argparse's versions lay out differently, and nothing else)."""
    return HELP_PART.sub(lambda part: " ".join(part[1].split()), text)


def up_to_date(text: str) -> bool:
    """Whether a page's generated parts are what the code generates now: the same text, or, where its ``--help``
    parts were printed by another Python than the one running, the same words in them.

    >>> page = render("<!-- generated: help broker -->\\n")
    >>> up_to_date(page), up_to_date(page.replace("usage:", "usage:  "))
    (True, False)
    >>> other = page.replace(f"Python {PYTHON}", "Python 3.99")
    >>> up_to_date(other.replace("usage:", "usage:  ")), up_to_date(other.replace("usage:", "use:"))
    (True, False)
    """
    rendered = render(text)
    if rendered == text:
        return True
    if set(PRINTED_BY.findall(text)) - {PYTHON}:
        return _words_of_help(rendered) == _words_of_help(text)
    return False


def stale_pages(docs: Path = DOCS) -> list[Path]:
    """The pages whose committed generated parts differ from what the code generates now (:func:`up_to_date`)."""
    return [page for page in pages(docs) if not up_to_date(page.read_text(encoding="utf-8"))]


def write_pages(docs: Path = DOCS) -> list[Path]:
    """Regenerate the parts of every page that is not :func:`up_to_date`, in place; the pages that changed (a page
    whose ``--help`` parts another Python printed with the same words is left as it is, not laid out anew)."""
    changed = []
    for page in pages(docs):
        text = page.read_text(encoding="utf-8")
        rendered = render(text)
        if not up_to_date(text):
            page.write_text(rendered, encoding="utf-8")
            changed.append(page)
    return changed


# -- the mkdocs hook --------------------------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # mkdocs' hook event
    """The page as committed, once its generated parts are known to be what the code generates (else the build
    fails: the site never disagrees with the code, and nothing is inserted twice)."""
    if "<!-- generated:" in markdown and not up_to_date(markdown):
        raise StalePage(f"{page.file.src_uri}: its generated parts differ from the code: run {WRITE}")
    return markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python docs/reference.py", description="Regenerate (or check) the reference pages' generated parts."
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write the generated parts into the pages")
    action.add_argument("--check", action="store_true", help="exit 1 when a page's generated parts are stale")
    args = parser.parse_args(argv)
    if args.write:
        for page in write_pages():
            print("wrote", page.relative_to(ROOT))
        return 0
    stale = stale_pages()
    for page in stale:
        print(f"{page.relative_to(ROOT)}: its generated parts differ from the code: run {WRITE}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
