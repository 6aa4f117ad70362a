"""Event sources for ``produce`` and ``train``: synthetic streams and files.

Synthetic streams are seeded, so the same settings write the same events:

- ``separable``: a hidden separator with margin γ (points with ‖x‖ ≤ 1);
- ``noisy``: the same with a share of labels flipped;
- ``drift``: the separator turns a quarter turn every ``drift_every`` events;
- ``credit``: the credit-approval story of the seeds: age, salary, years in
  job and debt, with a bank policy that changes at ``drift_every``.

>>> events = separable(dimensions=2, margin=0.2, seed=1)
>>> first = next(events)
>>> sorted(first), len(first["x"]), first["y"] in (-1, 1)
(['id', 'x', 'y'], 2, True)
>>> next(credit(seed=1))["features"].keys()
dict_keys(['age', 'salary', 'years_in_job', 'debt'])

Files: CSV with a header (a ``y`` column for the label, an optional ``id``
column, every other column a named feature) or JSONL in the wire format.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

from service.schema import InputEvent


def _unit(rng: random.Random, d: int) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(d)]
    n = math.sqrt(sum(a * a for a in v)) or 1.0
    return [a / n for a in v]


def _in_ball(rng: random.Random, d: int) -> list[float]:
    radius = rng.random() ** (1.0 / d)
    return [radius * a for a in _unit(rng, d)]


def separable(dimensions: int = 10, margin: float = 0.1, noise: float = 0.0, seed: int = 42,
              drift_every: int | None = None, unlabeled: float = 0.0) -> Iterator[dict]:
    """Points in the unit ball labeled by a hidden hyperplane w·x + b.

    Points closer than ``margin`` to the hyperplane are not drawn, so the
    clean stream has margin ≥ γ; with ``drift_every`` the normal turns from
    one random direction to another, a quarter turn per ``drift_every``.
    """
    rng = random.Random(seed)
    start, turn_to = _unit(rng, dimensions), _unit(rng, dimensions)
    bias = rng.uniform(-0.2, 0.2)
    i = 0
    while True:
        if drift_every:
            phi = (math.pi / 2) * i / drift_every
            w = [math.cos(phi) * a + math.sin(phi) * b for a, b in zip(start, turn_to)]
            norm = math.sqrt(sum(a * a for a in w))
            w = [a / norm for a in w]
        else:
            w = start
        x = _in_ball(rng, dimensions)
        distance = sum(a * b for a, b in zip(w, x)) + bias
        if abs(distance) < margin:
            continue
        y = 1 if distance > 0 else -1
        if noise and rng.random() < noise:
            y = -y
        event = {"id": f"p-{i}", "x": [round(a, 6) for a in x], "y": y}
        if unlabeled and rng.random() < unlabeled:
            del event["y"]
        yield event
        i += 1


def credit(noise: float = 0.05, seed: int = 42, drift_every: int = 5000, unlabeled: float = 0.0) -> Iterator[dict]:
    """Credit applications; approve (+1) when the bank's linear score is positive.

    Before ``drift_every`` events the bank weighs salary against debt; after
    it, a new policy weighs years in job more and debt twice as hard, so the
    mistake rate climbs and then recovers as the perceptron adapts.
    """
    rng = random.Random(seed)
    i = 0
    while True:
        age = rng.randint(18, 75)
        salary = round(rng.lognormvariate(math.log(45_000), 0.45), -2)
        years_in_job = round(min(age - 18, rng.expovariate(1 / 6)), 1)
        debt = round(rng.lognormvariate(math.log(12_000), 0.9), -2)
        if i < drift_every:
            score = 0.5 * (salary - 45_000) / 20_000 - 0.6 * (debt - 12_000) / 15_000 + 0.1 * (years_in_job - 5) / 5
        else:
            score = 0.3 * (salary - 45_000) / 20_000 - 1.2 * (debt - 12_000) / 15_000 + 0.5 * (years_in_job - 5) / 5
        score += 0.05 * (age - 40) / 15
        y = 1 if score > 0 else -1
        if noise and rng.random() < noise:
            y = -y
        event = {"id": f"app-{i}", "features": {"age": age, "salary": salary, "years_in_job": years_in_job, "debt": debt}, "y": y}
        if unlabeled and rng.random() < unlabeled:
            del event["y"]
        yield event
        i += 1


def synthetic(stream: str, *, dimensions: int, margin: float, noise: float, drift_every: int, seed: int, unlabeled: float) -> Iterator[dict]:
    """The named synthetic stream."""
    if stream == "separable":
        return separable(dimensions, margin, 0.0, seed, None, unlabeled)
    if stream == "noisy":
        return separable(dimensions, margin, noise, seed, None, unlabeled)
    if stream == "drift":
        return separable(dimensions, margin, noise, seed, drift_every, unlabeled)
    if stream == "credit":
        return credit(noise, seed, drift_every, unlabeled)
    raise ValueError(f"unknown stream {stream!r}")


def read_file(path: Path) -> Iterator[bytes]:
    """The messages of a CSV or JSONL file, as wire-format JSON bytes.

    JSONL lines are passed on as they are (a bad line is the consumer's to
    reject); CSV rows become ``{"id", "features", "y"}`` events.
    """
    for _, message in _numbered_messages(path):
        yield message


def _numbered_messages(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number in the file, message) for each message of :func:`read_file`."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        with path.open("rb") as f:
            for lineno, line in enumerate(f, start=1):
                line = line.strip()
                if line:
                    yield lineno, line
        return
    for lineno, row in _csv_rows(path):
        yield lineno, json.dumps(row).encode()


#: The CSV label spellings, as the wire format maps them (0 and false → -1).
CSV_LABELS = {"1": 1, "+1": 1, "-1": -1, "0": -1, "true": 1, "false": -1}


def csv_label(text: str) -> int:
    """A CSV label cell to -1/+1: only the exact spellings of :data:`CSV_LABELS`
    (true/false in any case, surrounding spaces ignored); anything else is a
    ValueError, never rounded (0.5 is not a label).

    >>> [csv_label(v) for v in ("1", "+1", "-1", "0", "True", " false ")]
    [1, 1, -1, -1, 1, -1]
    >>> csv_label("0.5")
    Traceback (most recent call last):
    ...
    ValueError: label '0.5' is not one of -1, 1, +1, 0, true, false
    """
    label = CSV_LABELS.get(text.strip().lower())
    if label is None:
        raise ValueError(f"label {text!r} is not one of -1, 1, +1, 0, true, false")
    return label


def _csv_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, event) for each row of a CSV file with a header."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise ValueError(f"{path} is empty; a CSV needs a header row")
        for row in reader:
            lineno = reader.line_num  # the row's last line (a quoted cell may span lines)
            event: dict = {}
            if "id" in row:
                event["id"] = row.pop("id")
            label = row.pop("y", None)
            try:
                event["features"] = {k: float(v) for k, v in row.items()}
                if label not in (None, ""):
                    event["y"] = csv_label(label)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            yield lineno, event


def load_dataset(path: Path) -> tuple[list[list[float]], list[int], list[str]]:
    """A labeled file as (X, y, feature names) for the batch algorithms.

    Every event must carry a label.  All events must have the same form: every
    one dense (``x``, all of the same length) or every one named
    (``features``; names ordered as first seen, a name missing from an event
    counts as 0).  A file mixing the forms is rejected, naming the first line
    that breaks the rule: a dense x[i] and a named feature are not the same
    feature, so lining them up by position would train on garbage.  Errors
    are ValueErrors naming the file and line (``train`` exits with code 2).
    """
    path = Path(path)
    rows: list[tuple[list[float] | dict[str, float], int]] = []
    names: dict[str, None] = {}
    first: tuple[int, str, int] | None = None  # (line, form, dense length) of the first event
    for lineno, raw in _numbered_messages(path):
        where = f"{path}:{lineno}"
        try:
            event = InputEvent.model_validate_json(raw)
        except ValueError as exc:
            raise ValueError(f"{where}: invalid event: {exc.errors(include_url=False)[0]['msg'] if hasattr(exc, 'errors') else exc}") from None
        if event.y is None:
            raise ValueError(f"{where}: the event has no label; train needs labeled data")
        form = "features" if event.features is not None else "x"
        size = len(event.x) if event.x is not None else 0
        if first is None:
            first = (lineno, form, size)
        elif form != first[1]:
            raise ValueError(f"{where}: the event has {form!r} but the first event (line {first[0]}) has {first[1]!r}; "
                             "a file must hold dense (x) events only or named (features) events only")
        elif form == "x" and size != first[2]:
            raise ValueError(f"{where}: x has {size} values but the first event (line {first[0]}) has {first[2]}")
        if event.features is not None:
            names.update(dict.fromkeys(event.features))
            rows.append((event.features, event.y))
        else:
            rows.append((event.x, event.y))
    if not rows:
        raise ValueError(f"{path} holds no events")
    if names:
        order = list(names)
        X = [[r.get(n, 0.0) for n in order] for r, _ in rows]
    else:
        order = [f"x{i}" for i in range(len(rows[0][0]))]
        X = [list(r) for r, _ in rows]
    return X, [y for _, y in rows], order
