"""The stop deadline alone (perceptron_stream.runtime.shutdown), in a process of its own: its signals are real."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT

#: A process whose main thread never runs Python again once ready: SIGTERM blocked there, so the kernel gives
#: the signal to another thread and the sleep is never interrupted; the Python handler never runs. Only the
#: wakeup fd's watcher sees the signal.
MAIN_THREAD_NEVER_RUNS_PYTHON = """
import signal, sys, time
from perceptron_stream.runtime.shutdown import StopDeadline

StopDeadline(1.0, lambda name: print("asked to stop by", name, flush=True), lambda: "stuck in a test").install()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("ready", flush=True)
time.sleep(3600)
"""


def test_a_signal_the_main_thread_never_sees_still_stops_the_process_at_the_deadline():
    process = subprocess.Popen(
        [sys.executable, "-c", MAIN_THREAD_NEVER_RUNS_PYTHON],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline() == "ready\n"
        process.terminate()
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, err
    assert out == "asked to stop by SIGTERM\n"
    assert "did not stop within 1 s of SIGTERM: stuck in a test; exiting with code 1" in err
    assert err.count("did not stop within") == 1, err  # printed, not logged as well
