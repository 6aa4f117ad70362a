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

# The lint, the layout and the types first ([tool.ruff] and [tool.mypy] in pyproject.toml), over the whole tree
# (service/, tests/, bench/, docs/): a finding fails the run
python3 -m ruff format --check --quiet .
python3 -m ruff check --quiet .
python3 -m mypy  # what and how strictly: [tool.mypy]
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --quiet  # the documentation site: a broken link or a page missing from the nav fails

# One worker per core, each with its own embedded broker (Apache Kafka is one
# for the run, started by the controller: tests/conftest.py); idle workers take
# queued tests from busy ones (worksteal), so the long crash and fuzz tests
# do not end up on one worker. `-n 0` runs everything in this process.
exec python3 -m pytest -n auto --dist worksteal --durations=30 "$@"
