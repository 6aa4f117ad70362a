"""The changelog of the Kafka store's pending tables: their changes on a compacted topic, and a table rebuilt from it.

With the Kafka store the pending tables (:mod:`perceptron_stream.state.pending`) live in
a cache directory, so their durable copy is a changelog, as a Kafka Streams
store's is: before each checkpoint the joiner writes the epoch's changes to a
compacted topic partitioned like the input, each tagged with the checkpoint
(epoch) it belongs to and the run that wrote it. A restore replays the topic
and keeps only the changes the restored checkpoint's *lineage* (which run
owned which epochs) covers; a change a crashed run wrote after its last
checkpoint is recognised and undone by writing the valid value again.

Under ``--processing-guarantee exactly-once`` the epoch's changes go into the
transaction that commits its checkpoint (``write(..., into=stream)``:
``send_to`` the input partition's number), so they are visible exactly when
the checkpoint and its positions are. The topic's reader reads committed
records only: an aborted span's changes (a crash, a fenced zombie) are never
read back, and the restore is the last committed checkpoint's table with
nothing to undo. The undo stays for what exactly-once cannot vouch for (records
an at-least-once run of the same group wrote before); its repairs then go
into the task's next transaction (``in_transactions``), never around it.

A change's stored point is written as the JSON it is (``orjson.Fragment``),
not as a JSON string of it: escaped again inside a string every quote and
backslash of a point doubled, and a point of 978,916 bytes became a record of
1,879,113, beyond the topic's 1 MiB. A point whose record would still exceed
the topic's ``max.message.bytes`` is never kept (:meth:`Changelog.room`, the
joiner's check): its event is dead-lettered ``output_refused`` instead; so is
an early label (one before its point) whose row would (a large key or id).
Records written before read back as they are (a point as a JSON string).
"""

from __future__ import annotations

import logging
import math

import orjson
from perceptron_stream.kafka.contract import refuse_too_large
from perceptron_stream.state.pending import PendingTable
from perceptron_stream.state.pending.table import row_key

log = logging.getLogger("perceptron_stream")

#: The run tag of a change written at a restore to undo a crashed run's later one.
REPAIR = "repair"
#: A change's value beside its point: ``{"epoch":E,"run":"R","row":["pending",AT,...]}`` is at most 99 bytes.
CHANGE_OVERHEAD_BYTES = 128


def change_value(epoch: int, run: str, row: list | None) -> bytes:
    """A changelog record's value; the row's point (JSON text, or None) embedded as JSON, not re-escaped.

    >>> change_value(3, "r1", ["pending", 1.5, '{"x":{"a":1.0}}'])
    b'{"epoch":3,"run":"r1","row":["pending",1.5,{"x":{"a":1.0}}]}'
    """
    if row is not None and row[2] is not None:
        row = [row[0], row[1], orjson.Fragment(row[2])]
    return orjson.dumps({"epoch": epoch, "run": run, "row": row})


def _valid(lineage: list[list], epoch: int, run: str) -> bool:
    """Whether ``run``'s change in ``epoch`` is part of the history a checkpoint's lineage describes.

    >>> _valid([[1, "a"], [5, "b"]], 4, "a"), _valid([[1, "a"], [5, "b"]], 5, "a"), _valid([[1, "a"], [5, "b"]], 7, "b")
    (True, False, True)
    """
    owner = None
    for first, who in lineage:
        if epoch >= first:
            owner = who
    return owner == run


def decode_change(value: bytes | None) -> tuple[int, str, list | None]:
    """A changelog record (epoch, run, row), checked: it is read back from a topic others can write."""
    doc = orjson.loads(value) if value is not None else None
    if (
        type(doc) is not dict
        or type(doc.get("epoch")) is not int
        or doc["epoch"] < 1
        or type(doc.get("run")) is not str
    ):
        raise ValueError("not a pending-table change")
    row = doc.get("row")
    if row is not None:
        ok = (
            type(row) is list
            and len(row) == 3
            and row[0] in ("pending", "labeled", "early")
            and type(row[1]) in (int, float)
            and math.isfinite(row[1])
            and (row[2] is None or type(row[2]) in (str, dict))
        )
        if not ok:
            raise ValueError("a pending-table change with a malformed row")
        if type(row[2]) is dict:  # embedded (change_value); a string: a record written before
            row[2] = orjson.dumps(row[2]).decode()
    return doc["epoch"], doc["run"], row


#: The largest magnitude of a value in a stored point read back: the largest --max-feature-value (service/config.py),
#: so a point the decoder let in always passes, and a model that learns it keeps every score finite (the bound
#: perceptron.MAX_STATE_MAGNITUDE's reasoning assumes of an event's values).
MAX_POINT_VALUE = 1e100


def refused_point(row: list) -> str | None:
    """Why the point a pending row holds cannot be learned from (``non_finite``, ``damaged``), None when it can.

    A point comes back from the changelog (a topic others can write) and its ``x`` is learned when its label comes,
    without the decoder's checks in between: a forged x of 1e300 would make a weight of 1e300 and every later
    score infinite.

    >>> refused_point(["pending", 1.0, '{"x": [1.0, -2.5], "score": 0.5}']), refused_point(["labeled", 1.0, None])
    (None, None)
    >>> refused_point(["pending", 1.0, '{"x": {"a": 1e300}, "score": 0.5}']), refused_point(["pending", 1.0, '{"x": "a"}'])
    ('non_finite', 'damaged')
    """
    if row[0] != "pending":
        return None
    try:
        point = orjson.loads(row[2])
    except (orjson.JSONDecodeError, TypeError):
        return "damaged"
    x = point.get("x") if type(point) is dict else None
    values = x if type(x) is list else list(x.values()) if type(x) is dict else None
    challengers = point.get("challengers", {}) if type(point) is dict else None
    if values is None or type(challengers) is not dict:
        return "damaged"
    scores = [point.get("score"), *challengers.values()]
    if not all(type(v) in (int, float) for v in values + scores):
        return "damaged"
    if not all(abs(v) <= MAX_POINT_VALUE for v in values) or not all(map(math.isfinite, scores)):
        return "non_finite"
    return None


class Changelog:
    """The Kafka store's changelog of pending tables: one compacted topic partitioned like the input.

    ``io`` does the Kafka work: ``send(partition, key, value)``, ``flush()``
    and ``read(partition) -> [(key, value)]`` (from the beginning, to the end),
    and names its ``topic``; ``on_reject(reason)``, when given, is told each
    record read back and refused (perceptron_rejected_state_total{kind="changelog"}). ``in_transactions`` (exactly-once): every write
    goes into a transaction (:meth:`write`'s ``into``), and the repairs of a
    restore wait for the next one.
    """

    def __init__(self, io, group_id: str, in_transactions: bool = False, on_reject=None):
        self.io, self.prefix, self.in_transactions = io, f"{group_id}/", in_transactions
        self.on_reject = on_reject or (lambda reason: None)
        self.repairs: dict[int, list[tuple[bytes, bytes]]] = {}  # partition → repairs for its next transaction

    def _key(self, partition: int, key: str) -> bytes:
        return f"{self.prefix}{partition}/{key}".encode()

    def write(self, partition: int, changes, epoch: int, run: str, into=None) -> None:
        """``changes`` ((key, row or None)) of ``partition``'s table in ``epoch``; ``into``: a stream with an open
        transaction (exactly-once), which they join, after the partition's repairs waiting for it."""
        if into is None:
            send = self.io.send
        else:
            topic = self.io.topic

            def send(p: int, key: bytes, value: bytes) -> None:
                into.send_to(topic, p, key, value)

            for key, value in self.repairs.pop(partition, ()):
                send(partition, key, value)
        limits, topic = getattr(self.io, "limits", None), self.io.topic
        for key, row in changes:
            record_key, value = self._key(partition, key), change_value(epoch, run, row)
            refuse_too_large(limits, topic, record_key, value)  # the joiner keeps no point this large (room)
            send(partition, record_key, value)

    def room(self, partition: int, point_id: str | int) -> int | None:
        """The largest stored point (its JSON bytes) of ``point_id`` the topic takes in a change (None: no limit
        known)."""
        limits = getattr(self.io, "limits", None)
        if limits is None:
            return None
        key = self._key(partition, row_key(point_id))
        return limits.of(self.io.topic) - len(key) - CHANGE_OVERHEAD_BYTES

    def too_large(self, partition: int, row_id: str | int, row: dict, estimate: int, what: str) -> str | None:
        """Why the stored ``what`` (a pending point, an early label) ``row`` of ``row_id`` cannot be kept: its change
        would be larger than the topic takes (None: it fits). ``estimate`` bounds its JSON's size from above
        (cheaply, from the record it came in): the row is measured only when that is beyond the room."""
        limits = getattr(self.io, "limits", None)
        if limits is None:
            return None
        # the key's bytes bounded from above without encoding it (a character is at most 4 bytes in UTF-8; the
        # partition's digits and the row key's tag at most 24): the room measured exactly only for a large row
        # (its key encoded for every point was a tenth of a kept point's own work)
        if estimate + len(self.prefix) * 4 + len(str(row_id)) * 4 + 24 + CHANGE_OVERHEAD_BYTES <= limits.of(
            self.io.topic
        ):
            return None
        room = self.room(partition, row_id)
        if room is None or estimate <= room:
            return None
        size = len(orjson.dumps(row))
        if size <= room:
            return None
        return (
            f"its {what} ({size} bytes) would make a changelog record beyond max.message.bytes="
            f"{self.io.limits.setting(self.io.topic)} of topic {self.io.topic}"
        )

    def flush(self) -> None:
        self.io.flush()

    def restore(self, partition: int, table: PendingTable, seq: int, lineage: list[list]) -> None:
        """``table`` as of checkpoint ``seq``, from the changelog; a change no checkpoint of the lineage covers
        (a crashed run's, after its last checkpoint) is undone by writing the valid value again."""
        prefix = f"{self.prefix}{partition}/".encode()
        valid: dict[str, list] = {}
        last_valid: dict[str, bool] = {}
        rejected = 0
        for key, value in self.io.read(partition):
            if key is None or not key.startswith(prefix):
                continue
            name = key[len(prefix) :].decode(errors="replace")
            try:
                epoch, run, row = decode_change(value)
            except ValueError:  # (orjson's errors among them: not JSON)
                rejected += 1
                self.on_reject("damaged")
                continue
            refusal = None if row is None else refused_point(row)
            if refusal is not None:  # its point never reaches the model
                rejected += 1
                self.on_reject(refusal)
                continue
            # a repair restates the value at checkpoint ``epoch``: true in every lineage through it
            ok = epoch <= seq and (run == REPAIR or _valid(lineage, epoch, run))
            last_valid[name] = ok
            if ok:
                if row is None:
                    valid.pop(name, None)
                else:
                    valid[name] = row
        if rejected:
            log.warning(
                "%d records of the pending changelog of partition %d were malformed and ignored", rejected, partition
            )
        table.load(valid, seq + 1)
        stale = [name for name, ok in last_valid.items() if not ok]
        repairs = [  # the newest record of these keys is not this lineage's: compaction must not keep it
            (self._key(partition, name), change_value(seq, REPAIR, valid.get(name))) for name in stale
        ]
        if self.in_transactions:  # with the task's next checkpoint (until then a restore finds the same ones)
            self.repairs[partition] = repairs
        elif repairs:
            for key, value in repairs:
                self.io.send(partition, key, value)
            self.io.flush()
        if stale:
            log.info(
                "restored the pending table of partition %d from the changelog: %d points, %d stale changes undone",
                partition,
                table.pending_count(),
                len(stale),
            )
