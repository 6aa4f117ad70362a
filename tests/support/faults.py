"""Faults a test injects into a service process from outside the service's code.

``python -m tests.support.faults abort-transaction N serve ARGS...`` runs ``perceptron-stream serve ARGS...``
with the N-th transaction that commits something aborted where its commit would be, once every record of it
(outputs, pending changelog, checkpoint) is in the brokers' logs; the service then stops as for any aborted
transaction. Neither a SIGKILL nor a paused broker can place an abort there: the changelog and checkpoint records
exist only in the few milliseconds of a commit. The clients' ``commit_transaction`` is wrapped (both clients), so
production code holds no switch for it (tests/integration/test_exactly_once.py).
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("perceptron_stream")


def abort_transaction(n: int) -> None:
    """Wrap both clients' ``commit_transaction`` so that the process's ``n``-th one is aborted instead."""
    from perceptron_stream.kafka import Aborted
    from perceptron_stream.kafka.confluent import ConfluentIO
    from perceptron_stream.kafka.kafka_python import KafkaIO

    commits = 0

    def wrapped(commit):
        def commit_transaction(self, positions, timeout_s):
            nonlocal commits
            commits += 1
            if commits != n:
                return commit(self, positions, timeout_s)
            self.flush(timeout_s)  # every record of it in the logs
            self.abort()
            log.warning("transaction %d aborted before its commit (the test's fault injection)", n)
            raise Aborted(f"transaction {n} aborted by the test's fault injection")

        return commit_transaction

    for client in (KafkaIO, ConfluentIO):
        client.commit_transaction = wrapped(client.commit_transaction)  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    fault, count, *command = argv
    if fault != "abort-transaction":
        raise SystemExit(f"unknown fault {fault!r}: abort-transaction N serve ARGS...")
    abort_transaction(int(count))
    from perceptron_stream.cli import main as cli

    return cli(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
