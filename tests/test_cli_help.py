"""Each command's --help names the command as it is typed, not the script's file name."""

import subprocess
import sys

import pytest
from perceptron_stream.cli import COMMANDS, PROG, main
from perceptron_stream.config import KafkaSettings

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
