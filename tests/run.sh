#!/usr/bin/env bash
# The test command of README.md: installs what the suite needs on a fresh
# machine (the project with its test extras, Debian's prometheus for the
# promtool checks and the real-Prometheus tests), then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    echo "installing Debian's prometheus (server + promtool) for the tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # the package may start a system instance where an init system runs; the tests start their own
    $SUDO systemctl stop prometheus 2>/dev/null || true
fi

# One worker per core, each with its own embedded broker; idle workers take
# queued tests from busy ones (worksteal), so the long crash and fuzz tests
# do not end up on one worker. `-n 0` runs everything in this process.
exec python3 -m pytest -n auto --dist worksteal "$@"
