"""A stop that always works: SIGTERM or SIGINT asks the loop to stop, and a deadline ends the process regardless.

Asked to stop, the loop finishes the batch in hand, waits for its
acknowledgements, writes the final checkpoint, commits and closes the
clients: about a second when the brokers answer. But the loop sees the
request only between two client calls, and a call may never return:
kafka-python 3.0.12 spun forever inside a poll after a batch it could not
decompress (issue 29), and a close waits for brokers that may be frozen. The
pod then burnt its CPU until Kubernetes killed it at the end of its grace
period. So the signal also starts a deadline, on a thread of its own: when it
passes, the process exits with :data:`EXIT_CODE` and a message saying what
the loop was doing and what was left undone.

Ending the process there is safe by the order the loop keeps (see
:mod:`perceptron_stream.runtime.checkpointer`): a checkpoint holds only positions whose
outputs the brokers acknowledged, written atomically, and the group's
offsets are only ever a checkpoint's. Whatever the loop was in the middle of,
the state left behind is an earlier consistent point, from which the next
start learns and publishes again; nothing past what was acknowledged is ever
checkpointed, because the deadline writes nothing.

The signal is seen even while the main thread cannot run Python code:
CPython's C-level handler writes each signal to a wakeup fd
(:func:`signal.set_wakeup_fd`) that a watcher thread reads, besides running
the Python handler in the main thread when it can.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("perceptron_stream")

#: The exit code of a stop cut short by the deadline (a clean stop exits 0).
EXIT_CODE = 1
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopDeadline:
    """On the first SIGTERM/SIGINT: ``request_stop(name)`` at once, and after ``seconds`` the process's exit.

    ``undone()`` describes, when the deadline passes, what the loop was doing
    and what it leaves undone; it runs on the deadline's thread while the loop
    may still be changing what it reads, so it must not raise (a failure gives
    a plainer message).
    """

    def __init__(self, seconds: float, request_stop: Callable[[str], None], undone: Callable[[], str]):
        self.seconds, self.request_stop, self.undone = seconds, request_stop, undone
        self._lock = threading.RLock()  # the Python handler may run again inside itself, on a second signal
        self.signal_name: str | None = None  # the first stop signal received

    def install(self) -> None:
        """Handle SIGTERM and SIGINT (from the main thread, as Python requires), and watch the wakeup fd."""
        for signum in SIGNALS:
            signal.signal(signum, lambda number, _frame: self.signalled(number))
        reader, writer = socket.socketpair()
        writer.setblocking(False)  # set_wakeup_fd's requirement: the C handler must never block
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._sockets = (reader, writer)  # kept open for the life of the process
        threading.Thread(target=self._watch, args=(reader,), name="stop-signals", daemon=True).start()

    def _watch(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:  # pragma: no cover - the socket is never closed while the process lives
                return
            if not data:  # pragma: no cover
                return
            for number in data:
                if number in SIGNALS:
                    self.signalled(number)

    def signalled(self, number: int) -> None:
        """The first stop signal asks the loop to stop and starts the deadline; later ones change nothing.

        Both the Python handler and the wakeup fd's watcher see each signal
        (the handler when the main thread runs Python): a second call is the
        same signal, or a second signal while the deadline already runs.
        """
        with self._lock:
            if self.signal_name is not None:
                return
            self.signal_name = signal.Signals(number).name
        threading.Thread(target=self._expire, name="stop-deadline", daemon=True).start()
        self.request_stop(self.signal_name)

    def _expire(self) -> None:
        threading.Event().wait(self.seconds)
        try:
            undone = self.undone()
        except Exception as exc:  # never let the description keep the process up
            undone = f"what was left undone is unknown ({exc!r})"
        message = (
            f"did not stop within {self.seconds:g} s of {self.signal_name}: {undone}; exiting with code {EXIT_CODE}"
        )
        try:  # printed, not logged as well: the log goes to stderr too, and said it twice
            print(f"perceptron-stream serve: {message}", file=sys.stderr, flush=True)
        finally:
            os._exit(EXIT_CODE)  # the main thread is stuck: sys.exit would only end this thread


def left_undone(doing: str, unsaved: int, in_hand: bool, *, stored: bool, to_commit: bool, started: bool) -> str:
    """The deadline's message: what the loop is ``doing`` and what ending the process now would leave undone.

    ``unsaved``: events processed since the last checkpoint; ``in_hand``: a
    batch whose outputs were not all acknowledged; ``stored``: a store keeps
    checkpoints; ``to_commit``: positions not committed yet; ``started``: the
    stream is open.

    >>> left_undone("processing a batch", 0, True, stored=False, to_commit=False, started=True)
    'stuck processing a batch; left undone: the batch in hand is not committed: the next start reads it again from the last committed offsets'
    """
    if stored and (unsaved or in_hand):
        events = f"{unsaved} event(s) processed since the last checkpoint" if unsaved else "the batch in hand"
        among = " (a batch whose outputs were not all acknowledged among them)" if unsaved and in_hand else ""
        left = (
            f"{events}{among} {'are' if unsaved else 'is'} not checkpointed: the next start learns and publishes "
            f"{'them' if unsaved else 'it'} again from the last checkpoint"
        )
    elif not stored and in_hand:
        left = "the batch in hand is not committed: the next start reads it again from the last committed offsets"
    elif to_commit:
        left = "the last positions were not committed to the consumer group (the next start " + (
            "seeks to the last checkpoint anyway)" if stored else "reads again from the last committed offsets)"
        )
    elif not started:
        left = "nothing was read yet"
    else:
        left = (
            "nothing to checkpoint or commit; the clients were not closed: the group notices this member is "
            "gone at its session timeout"
        )
    return f"stuck {doing}; left undone: {left}"
