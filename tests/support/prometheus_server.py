"""A real Prometheus server for tests, and the PromQL of the Grafana dashboard.

The tests run Debian's ``prometheus`` binary (``apt-get install prometheus``;
``tests/run.sh`` installs it). A test that needs it fails with a message
saying so when it is missing: it is never skipped.

Use it as a context manager::

    with PrometheusServer(tmp_path, targets=["127.0.0.1:8000"]) as prom:
        prom.wait_for('up{job="perceptron-stream"}', lambda r: r and r[0]["value"][1] == "1")
        prom.query("perceptron_mistakes_total")

or through the fixtures of tests/conftest.py:

- ``prometheus_factory``: a function ``start(targets=(), **kwargs)`` that
  starts a server per call; every server it started is stopped at teardown;
- ``prometheus``: one server with no targets, shared by a test module (enough
  to check that PromQL parses).

The server gets a generated config (written as JSON, which YAML reads) with a
1 s scrape and evaluation interval, its storage in a temporary directory, and
a free port on 127.0.0.1.

``dashboard_queries()`` returns the PromQL of every panel of
``deploy/grafana/dashboards/perceptron-stream.json`` with Grafana's variables
substituted, ready for ``PrometheusServer.query``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.support import ROOT

REPO_ROOT = ROOT
DASHBOARD_PATH = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "perceptron-stream.json"
ALERTS_PATH = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
DEFAULT_JOB = "perceptron-stream"

#: Values for Grafana's built-in variables when a dashboard query is sent to
#: Prometheus directly. The rate window must hold at least two scrapes.
GRAFANA_BUILTINS: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}


class PrometheusNotFound(RuntimeError):
    """The ``prometheus`` binary is not on PATH."""


class PrometheusStartError(RuntimeError):
    """The server exited or did not become ready."""


class PrometheusQueryError(RuntimeError):
    """The HTTP API answered a query with an error (e.g. 400 bad_data for a parse error)."""

    def __init__(self, query: str, http_status: int, error_type: str | None, error: str | None) -> None:
        super().__init__(f"{query!r}: HTTP {http_status} {error_type}: {error}")
        self.query = query
        self.http_status = http_status
        self.error_type = error_type
        self.error = error


def find_prometheus() -> str:
    """Path of the ``prometheus`` binary; a clear error when it is not installed."""
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusNotFound(
            "the `prometheus` binary is not on PATH: install Debian's package with "
            "`apt-get install -y prometheus` (tests/run.sh does it); these tests need a real server"
        )
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_config(
    targets: Sequence[str] | Mapping[str, Sequence[str]] = (),
    *,
    job: str = DEFAULT_JOB,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    rule_files: Sequence[str | os.PathLike[str]] = (),
    metrics_path: str = "/metrics",
) -> dict[str, Any]:
    """The Prometheus config as a dict: one scrape job per entry of ``targets``.

    ``targets`` is a list of ``host:port`` (one job named ``job``) or a mapping
    job name → list of ``host:port``.

    >>> cfg = render_config(["127.0.0.1:8000"])
    >>> cfg["scrape_configs"][0]["job_name"], cfg["scrape_configs"][0]["static_configs"]
    ('perceptron-stream', [{'targets': ['127.0.0.1:8000']}])
    >>> render_config()["scrape_configs"]
    []
    """
    jobs: Mapping[str, Sequence[str]]
    if isinstance(targets, Mapping):
        jobs = targets
    else:
        jobs = {job: list(targets)} if targets else {}
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval,
        },
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [
            {"job_name": name, "metrics_path": metrics_path, "static_configs": [{"targets": list(tgts)}]}
            for name, tgts in jobs.items()
        ],
    }


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Ask Linux to SIGTERM the server when the test process dies, so none is left behind.

    (Linux sends it when the *thread* that started the server ends: start
    servers from the main thread, as fixtures do.)
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class PrometheusServer:
    """One Prometheus process with a generated config; see the module doc."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        targets: Sequence[str] | Mapping[str, Sequence[str]] = (),
        *,
        job: str = DEFAULT_JOB,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        rule_files: Sequence[str | os.PathLike[str]] = (),
        metrics_path: str = "/metrics",
        startup_timeout: float = 30.0,
        binary: str | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.config = render_config(
            targets,
            job=job,
            scrape_interval=scrape_interval,
            evaluation_interval=evaluation_interval,
            rule_files=rule_files,
            metrics_path=metrics_path,
        )
        self.startup_timeout = startup_timeout
        self.binary = binary
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- life cycle -------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> PrometheusServer:
        binary = self.binary or find_prometheus()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(json.dumps(self.config, indent=2))
        last_error = ""
        for _attempt in range(5):  # another process may take the free port before we bind it
            self.port = free_port()
            self._log = open(self.log_path, "ab")  # noqa: SIM115 — Prometheus's log for its life: stop() closes it
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=info",
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                if self._ready():
                    return self
                time.sleep(0.05)
            tail = self.log_tail()
            self.stop()
            if "address already in use" not in tail:
                raise PrometheusStartError(
                    f"prometheus did not become ready on port {self.port} within {self.startup_timeout}s"
                    f" (config {config_path}); log tail:\n{tail}"
                )
            last_error = tail
        raise PrometheusStartError(f"no free port for prometheus after 5 attempts; log tail:\n{last_error}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP API ---------------------------------------------------------

    def api(
        self, path: str, params: Mapping[str, str] | None = None, *, post: bool = False
    ) -> tuple[int, dict[str, Any]]:
        """Call ``/api/v1/<path>``; returns (HTTP status, decoded JSON body) without raising on 4xx/5xx."""
        url = f"{self.url}/api/v1/{path}"
        data = None
        if params:
            encoded = urllib.parse.urlencode(params)
            if post:
                data = encoded.encode()
            else:
                url = f"{url}?{encoded}"
        req = urllib.request.Request(url, data=data, method="POST" if post else "GET")
        if post:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                return err.code, json.loads(body)
            except ValueError:
                return err.code, {"status": "error", "errorType": "http", "error": body.decode(errors="replace")}

    def query_raw(self, promql: str, at: float | None = None) -> tuple[int, dict[str, Any]]:
        """``/api/v1/query`` as (HTTP status, JSON body); a parse error is (400, {"errorType": "bad_data", ...})."""
        params = {"query": promql}
        if at is not None:
            params["time"] = repr(at)
        return self.api("query", params, post=True)

    def query(self, promql: str, at: float | None = None) -> list[Any]:
        """The ``data.result`` of an instant query; raises PrometheusQueryError on an error answer."""
        status, body = self.query_raw(promql, at)
        if status != 200 or body.get("status") != "success":
            raise PrometheusQueryError(promql, status, body.get("errorType"), body.get("error"))
        return body["data"]["result"]

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[Any]], bool] = bool,
        timeout: float = 30.0,
        interval: float = 0.25,
    ) -> list[Any]:
        """Query until ``predicate(result)`` holds; returns that result, or raises TimeoutError with the last one."""
        deadline = time.monotonic() + timeout
        result: list[Any] = []
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{promql!r} did not satisfy the predicate within {timeout}s; last result: {result!r}"
                )
            time.sleep(interval)

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (``/api/v1/targets``), with their health and last error."""
        status, body = self.api("targets")
        assert status == 200, body
        return body["data"]["activeTargets"]

    def rule_groups(self) -> list[dict[str, Any]]:
        """The loaded rule groups (``/api/v1/rules``)."""
        status, body = self.api("rules")
        assert status == 200, body
        return body["data"]["groups"]


# -- the dashboard's PromQL -----------------------------------------------------

_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute_grafana_variables(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$name``, ``${name}``, ``${name:fmt}`` and ``[[name]]`` by ``values[name]``.

    >>> substitute_grafana_variables('rate(x{instance=~"$instance"}[$__rate_interval])',
    ...                              {"instance": ".*", "__rate_interval": "1m"})
    'rate(x{instance=~".*"}[1m])'
    >>> substitute_grafana_variables("${job}", {})
    Traceback (most recent call last):
    ...
    KeyError: "the expression uses variable 'job', which has no value: '${job}'"
    """

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise KeyError(f"the expression uses variable {name!r}, which has no value: {expr!r}")
        return values[name]

    return _VARIABLE.sub(repl, expr)


def dashboard_variable_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """What each templating variable stands for in a direct query.

    A variable with "All" selected stands for its ``allValue`` (a regex, used
    with ``=~``); otherwise for its current value. Grafana's built-ins get
    :data:`GRAFANA_BUILTINS`.
    """
    values = dict(GRAFANA_BUILTINS)
    for var in dashboard.get("templating", {}).get("list", []):
        current = var.get("current", {}).get("value")
        if isinstance(current, list):
            current = current[0] if len(current) == 1 else "$__all"
        if current == "$__all" or (current is None and var.get("includeAll")):
            values[var["name"]] = var.get("allValue") or ".*"
        elif current is not None:
            values[var["name"]] = str(current)
        else:
            raise KeyError(f"dashboard variable {var['name']!r} has no current value")
    return values


def iter_panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def load_dashboard(path: str | os.PathLike[str] = DASHBOARD_PATH) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def dashboard_targets(path: str | os.PathLike[str] = DASHBOARD_PATH) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL with variables substituted) for every target of every panel."""
    dashboard = load_dashboard(path)
    values = dashboard_variable_values(dashboard)
    out = []
    for panel in iter_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            out.append(
                (panel.get("title", ""), target.get("refId", ""), substitute_grafana_variables(target["expr"], values))
            )
    return out


def dashboard_queries(path: str | os.PathLike[str] = DASHBOARD_PATH) -> list[str]:
    """The PromQL of every panel target, with Grafana variables substituted (``$__rate_interval`` → 1m, …).

    >>> qs = dashboard_queries()
    >>> any("perceptron_mistake_rate" in q for q in qs), any("$" in q for q in qs)
    (True, False)
    """
    return [expr for _title, _ref, expr in dashboard_targets(path)]


def prometheus_annotations(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's annotations that query Prometheus."""
    return [a for a in dashboard["annotations"]["list"] if a.get("datasource", {}).get("type") == "prometheus"]


def alert_rules(path: str | os.PathLike[str] = ALERTS_PATH) -> list[dict[str, Any]]:
    """The alerting rules of deploy/prometheus/alerts.yml (or ``path``), every group's."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]
