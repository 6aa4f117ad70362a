#!/usr/bin/env bash
# The test command of README.md: installs what the suite needs on a fresh
# machine (the project with its test extras, Debian's prometheus for the
# promtool checks and the real-Prometheus tests, Debian's Java and Maven for
# Apache Kafka, whose jars Maven fetches once into ~/.cache), then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v java >/dev/null || missing+=(default-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian's ${missing[*]} for the tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # the prometheus package may start a system instance where an init system runs; the tests start their own
    $SUDO systemctl stop prometheus 2>/dev/null || true
fi

# Apache Kafka's jars (the version pinned in tests/apache_kafka/pom.xml), fetched once
python3 tests/support/apache_kafka.py --fetch >/dev/null

# The lint, the layout and the types ([tool.ruff] and [tool.mypy] in pyproject.toml), over the whole tree
# (service/, tests/, bench/, docs/): a finding fails the run. mypy (48 s of one core from a cold cache, as in CI)
# runs beside the tests, which leave a core idle while they wait on brokers; its findings are shown, and fail the
# run, when the tests are done.
python3 -m ruff format --check --quiet .
python3 -m ruff check --quiet .
mypy_log=$(mktemp)
python3 -m mypy >"$mypy_log" 2>&1 &  # what and how strictly: [tool.mypy]
mypy_pid=$!
# (set -e holds in the trap too: a kill that finds no mypy must not fail the run; none once it was waited for)
trap '[ -z "$mypy_pid" ] || kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet  # the documentation site: a broken link or a page missing from the nav fails

# Two workers per core, each with its own embedded broker (Apache Kafka is one
# for the run, started by the controller: tests/conftest.py): most tests wait on
# brokers, group sessions and service processes, and a second worker per core
# runs in those waits (2 cores: 4 workers, the whole suite 541 s against 902 s
# with 2 and 632 s with 3, one run each on a shared machine). Idle workers take
# queued tests from busy ones (worksteal), so the long crash and fuzz tests
# do not end up on one worker. `-n 0` (or any -n) after it overrides the count.
status=0
python3 -m pytest -n "$((2 * $(nproc)))" --dist worksteal --durations=30 "$@" || status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
mypy_pid=""
if [ "$mypy_status" -ne 0 ]; then
    cat "$mypy_log" >&2
    echo "mypy: the findings above fail the run" >&2
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
