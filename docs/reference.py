"""The mkdocs hook that writes the reference pages from the code: the one home of generated documentation.

A page asks for a generated part with a marker on a line of its own, which the hook replaces when mkdocs reads
the page (``on_page_markdown``), so the site can never disagree with the code it documents:

- ``<!-- generated: settings serve -->``: the table of a command's settings, from its pydantic settings class in
  service/config.py (name, flag, environment variable, type, default, description);
- ``<!-- generated: help serve -->``: the output of ``perceptron-stream serve --help``;
- ``<!-- generated: schema prediction -->``: a JSON Schema of schemas/ as a table of its fields, and the schema.

An unknown marker fails the build. Nothing here is hand-copied: change a description in service/config.py and
the reference page changes with it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # mkdocs loads this file by path; the service package is the checkout's
    sys.path.insert(0, str(ROOT))

from perceptron_stream.cli import COMMANDS, main  # noqa: E402
from perceptron_stream.config import env_var, flag  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402
from pydantic_settings import BaseSettings  # noqa: E402

MARKER = re.compile(r"^<!-- generated: (?P<kind>[a-z]+) (?P<name>[a-z-]+) -->$", re.MULTILINE)
SCHEMAS = ROOT / "schemas"


class UnknownMarker(ValueError):
    """A page asks for a generated part that does not exist (a typo, or a command or schema that was removed)."""


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
    if command not in COMMANDS:
        raise UnknownMarker(f"no command {command!r}: one of {', '.join(COMMANDS)}")
    return settings_table_of(COMMANDS[command][0])


def settings_table_of(cls: type[BaseSettings]) -> str:
    """The Markdown table of a settings class's fields, in the order of the class."""
    rows = [
        "| setting | flag | environment variable | type | default | description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, field in cls.model_fields.items():
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
    if command not in COMMANDS and command != "perceptron-stream":
        raise UnknownMarker(f"no command {command!r}: one of {', '.join(COMMANDS)}")
    argv = ["--help"] if command == "perceptron-stream" else [command, "--help"]
    out = io.StringIO()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the page is the same on every machine
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    if code != 0:
        raise RuntimeError(f"perceptron-stream {' '.join(argv)} exited {code}")
    return "```text\n" + out.getvalue().rstrip() + "\n```"


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


# -- the hook ---------------------------------------------------------------------------------------------------

GENERATORS = {"settings": settings_table, "help": command_help, "schema": schema_section}


def render(markdown: str) -> str:
    """The page with every marker replaced by what it asks for."""

    def replace(match: re.Match[str]) -> str:
        generator = GENERATORS.get(match["kind"])
        if generator is None:
            raise UnknownMarker(f"no generator {match['kind']!r}: one of {', '.join(GENERATORS)}")
        return generator(match["name"])

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # mkdocs' hook event
    return render(markdown)
