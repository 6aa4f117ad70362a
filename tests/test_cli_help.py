"""Each command's --help names the command as it is typed, not the script's file name."""

import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from perceptron_stream.cli import COMMANDS, PROG, main
from perceptron_stream.config import KafkaSettings
from pydantic import SecretStr

from tests.support import ROOT


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_shows_the_command_line_name(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {PROG} {command} "), out.splitlines()[0]
    assert "cli.py" not in out


def test_help_through_python_dash_m():
    """`python -m perceptron_stream.cli` is where argparse would say "cli.py" (sys.argv[0])."""
    proc = subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {PROG} serve "), proc.stdout.splitlines()[0]


def test_the_name_stays_on_its_command(capsys):
    main(["serve", "--help"])
    main(["produce", "--help"])
    capsys.readouterr()
    assert KafkaSettings.model_config.get("cli_prog_name") is None  # the shared base is untouched


# what --help shows for a value of each type, as a user reads it
WORDS = {Path: "PATH", SecretStr: "SECRET", str: "TEXT", int: "INT", float: "NUMBER"}


def _value_type(annotation):
    """The type of a setting's value, ``X`` of ``X | None``."""
    rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return rest[0] if len(rest) == 1 and type(None) in typing.get_args(annotation) else annotation


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_names_values_as_a_user_would(command, capsys):
    """PATH, SECRET, TEXT, INT, NUMBER and the set of choices, not the Python types pydantic-settings prints by
    itself (``{Path,null}``, ``{SecretStr,null}``, ``{str,null}``, ``int``)."""
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    for python in ("Path", "SecretStr", "str", "int", "float"):
        assert not re.search(rf"(--[a-z-]+ |[{{,]){python}\b", out), (python, out)
    assert ",null}" not in out
    shown = 0
    for name, field in COMMANDS[command][0].model_fields.items():
        word = WORDS.get(_value_type(field.annotation))
        if word:
            assert f"--{name.replace('_', '-')} {word}" in out, (name, field.annotation)
            shown += 1
    assert shown > 0


def test_a_choice_that_may_be_absent_lists_its_values_only(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--sasl-mechanism {PLAIN,SCRAM-SHA-256,SCRAM-SHA-512}" in out
    assert "--ssl-cafile PATH" in out and "--sasl-password SECRET" in out and "--label-topic TEXT" in out
    assert "--standardize | --no-standardize" in out  # a bool stays a pair of flags
