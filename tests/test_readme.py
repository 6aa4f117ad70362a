"""README.md stays true to the code: settings, commands, metrics and the test command."""

from perceptron_stream.cli import COMMANDS
from perceptron_stream.config import ServeSettings, env_var, flag
from perceptron_stream.metrics import ServiceMetrics

from tests.support import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_serve_setting_is_in_the_configuration_table():
    for name in ServeSettings.model_fields:
        assert f"| `{name}` | `{flag(name)}` | `{env_var(name)}` |" in README, name


def test_every_command_is_documented():
    for command in COMMANDS:
        assert f"`perceptron-stream {command}" in README, command


def test_every_service_metric_is_documented():
    names = {
        m.name
        for m in ServiceMetrics(window=10, version="t", variant="plain").registry.collect()
        if m.name.startswith("perceptron_")
    }
    assert names, "no perceptron_ metrics"
    for name in names:
        # counters are exposed with _total, infos with _info
        assert any(f"`{name}{suffix}`" in README for suffix in ("", "_total", "_info")), name


def test_ci_runs_the_readme_test_command():
    assert "bash tests/run.sh" in README
    assert "tests/run.sh" in (ROOT / ".ci" / "run").read_text()
