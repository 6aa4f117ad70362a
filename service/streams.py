"""Event sources for ``produce`` and ``train``: synthetic streams and files.

Synthetic streams are seeded, so the same settings write the same events:

- ``separable``: a hidden separator w·x + b with margin γ, points with ‖x‖ ≤ 1;
- ``noisy``: the same with a share of labels flipped;
- ``drift``: the separator turns a quarter turn every ``drift_every`` events;
- ``credit``: the credit-approval story of the seeds: age, salary, years in
  job and debt, with a bank policy that changes at ``drift_every``.

Tests check these promises against the truth the generators expose
(:func:`separator`, :data:`POLICIES`).

>>> events = separable(dimensions=2, margin=0.2, seed=1)
>>> first = next(events)
>>> sorted(first), len(first["x"]), first["y"] in (-1, 1)
(['id', 'x', 'y'], 2, True)
>>> next(credit(seed=1))["features"].keys()
dict_keys(['age', 'salary', 'years_in_job', 'debt'])

Delayed labels: :func:`delayed_labels` splits any of these streams into
points without ``y`` and their labels ``{"id", "y"}`` (``produce
--label-topic`` sends the labels later, on a topic of their own).

Files: CSV with a header (a ``y`` column for the label, an optional ``id``
column, every other column a named feature, or with ``dense`` the values of
a dense ``x`` in column order) or JSONL in the wire format. A CSV is read as
spreadsheets write it: a byte-order mark (Excel's "CSV UTF-8") is not part of
the first column's name, and a file separated by ``;`` or tabs is refused
naming its separator (a ``;`` file's numbers often have decimal commas too).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from perceptron_stream.learning.labels import CSV_LABELS
from perceptron_stream.wire.messages import InputEvent

#: The largest margin the separable streams take. With ‖x‖ ≤ 1 no hyperplane
#: keeps both classes 1 or more away; the rest of the gap leaves room for the
#: bias and for writing x with 6 decimals.
MAX_MARGIN = 0.99


def _unit(rng: random.Random, d: int) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(d)]
    n = math.sqrt(sum(a * a for a in v)) or 1.0
    return [a / n for a in v]


def _in_ball(rng: random.Random, d: int) -> list[float]:
    radius = rng.random() ** (1.0 / d)
    return [radius * a for a in _unit(rng, d)]


def _rounding(d: int) -> float:
    """More than x's 6-decimal rounding can move ‖x‖ or w·x (0.5e-6 per coordinate)."""
    return 1e-6 * math.sqrt(d)


def _draw_separator(
    rng: random.Random, d: int, margin: float, drift_every: int | None
) -> Callable[[int], tuple[list[float], float]]:
    """Event index → (unit normal, bias): drawn first from ``rng``, so tests can rebuild the truth from the seed."""
    if not 0.0 <= margin <= MAX_MARGIN:
        raise ValueError(f"margin must be in [0, {MAX_MARGIN}] (points have ‖x‖ ≤ 1), got {margin}")
    first, other = _unit(rng, d), _unit(rng, d)
    # w·x spreads about ±1/√(d + 2): a bias on that scale keeps both classes common in any dimension,
    # and the factor (1 − γ) leaves both room at distance ≥ γ within the ball
    bias = rng.uniform(-0.5, 0.5) * (1.0 - margin) / math.sqrt(d + 2)
    if not drift_every:
        return lambda i: (first, bias)
    # the turns happen in the plane of two orthonormal directions (in 1-d, a turn flips the line)
    dot = sum(a * b for a, b in zip(first, other))
    second = [b - dot * a for a, b in zip(first, other)]
    norm = math.sqrt(sum(a * a for a in second))
    step = math.pi / 2 if norm > 1e-9 else math.pi
    second = [a / norm for a in second] if norm > 1e-9 else first
    cache: dict[int, list[float]] = {}

    def at(i: int) -> tuple[list[float], float]:
        k = i // drift_every
        if k not in cache:
            c, s = round(math.cos(k * step), 12), round(math.sin(k * step), 12)  # exact quarter turns
            cache.clear()
            cache[k] = [c * a + s * b for a, b in zip(first, second)]
        return cache[k], bias

    return at


def separator(
    dimensions: int = 10, margin: float = 0.1, seed: int = 42, drift_every: int | None = None
) -> Callable[[int], tuple[list[float], float]]:
    """The hidden separator of :func:`separable` with these settings: event i → (unit w, b).

    >>> w, b = separator(dimensions=3, seed=1)(0)
    >>> round(sum(a * a for a in w), 9), abs(b) < 0.5
    (1.0, True)
    """
    return _draw_separator(random.Random(seed), dimensions, margin, drift_every)


def separable(
    dimensions: int = 10,
    margin: float = 0.1,
    noise: float = 0.0,
    seed: int = 42,
    drift_every: int | None = None,
    unlabeled: float = 0.0,
) -> Iterator[dict]:
    """Points in the unit ball labeled by a hidden hyperplane w·x + b (see :func:`separator`).

    Each point is drawn uniformly in the ball, then its signed distance s to
    the hyperplane is squeezed from [0, 1 + b] onto [γ, 1 + b] (and likewise
    on the negative side), moving it straight away from the hyperplane; its
    other components shrink if they must to stay in the ball. Every point is
    thus γ or more from the separator with no rejection sampling, which never
    ended for a margin near 1 or in high dimensions (w·x concentrates near 0).
    With ``drift_every`` the normal turns a quarter turn every ``drift_every``
    events; ``noise`` flips that share of labels, ``unlabeled`` drops that share.
    """
    rng = random.Random(seed)
    truth = _draw_separator(rng, dimensions, margin, drift_every)
    slack = _rounding(dimensions)
    radius, gamma = 1.0 - slack, margin + slack  # the promises hold for x as written, to 6 decimals
    i = 0
    while True:
        w, bias = truth(i)
        x = [radius * a for a in _in_ball(rng, dimensions)]
        along = sum(a * b for a, b in zip(w, x))
        s = along + bias
        if s >= 0:
            s = gamma + s * (radius + bias - gamma) / (radius + bias)
        else:
            s = -gamma + s * (radius - bias - gamma) / (radius - bias)
        new_along = s - bias
        rest = [a - along * b for a, b in zip(x, w)]
        room, size = math.sqrt(max(0.0, radius * radius - new_along * new_along)), math.sqrt(sum(a * a for a in rest))
        shrink = room / size if size > room else 1.0
        x = [new_along * b + shrink * a for a, b in zip(rest, w)]
        y = 1 if s > 0 else -1
        if noise and rng.random() < noise:
            y = -y
        event = {"id": f"p-{i}", "x": [round(a, 6) for a in x], "y": y}
        if unlabeled and rng.random() < unlabeled:
            del event["y"]
        yield event
        i += 1


#: The bank's policies, before and after the change: weights of standardised
#: features (value − centre) / scale; approve (+1) when the sum is positive.
#: The second policy weighs years in job more and debt twice as hard.
POLICIES = (
    {"salary": 0.5, "debt": -0.6, "years_in_job": 0.1, "age": 0.05},
    {"salary": 0.3, "debt": -1.2, "years_in_job": 0.5, "age": 0.05},
)
_SCALES = {"salary": (45_000, 20_000), "debt": (12_000, 15_000), "years_in_job": (5, 5), "age": (40, 15)}


def bank_score(features: dict, policy: dict) -> float:
    """The bank's linear score of an application under ``policy`` (one of :data:`POLICIES`)."""
    return sum(weight * (features[name] - _SCALES[name][0]) / _SCALES[name][1] for name, weight in policy.items())


def credit(noise: float = 0.05, seed: int = 42, drift_every: int = 5000, unlabeled: float = 0.0) -> Iterator[dict]:
    """Credit applications, labeled by the bank's policy (:data:`POLICIES`).

    Ages 18-75, salaries log-normal around 45 000, years in job at most
    age − 18, debts log-normal around 12 000. The policy changes once, at
    event ``drift_every``: the mistake rate climbs, then recovers as the
    perceptron adapts. (river's Agrawal generator has no debt or years in
    job and labels by rules, not by a linear score: the story is this one.)
    """
    rng = random.Random(seed)
    i = 0
    while True:
        age = rng.randint(18, 75)
        salary = round(rng.lognormvariate(math.log(45_000), 0.45), -2)
        years_in_job = round(min(age - 18, rng.expovariate(1 / 6)), 1)
        debt = round(rng.lognormvariate(math.log(12_000), 0.9), -2)
        features = {"age": age, "salary": salary, "years_in_job": years_in_job, "debt": debt}
        y = 1 if bank_score(features, POLICIES[i >= drift_every]) > 0 else -1
        if noise and rng.random() < noise:
            y = -y
        event = {"id": f"app-{i}", "features": features, "y": y}
        if unlabeled and rng.random() < unlabeled:
            del event["y"]
        yield event
        i += 1


def synthetic(
    stream: str, *, dimensions: int, margin: float, noise: float, drift_every: int, seed: int, unlabeled: float
) -> Iterator[dict]:
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


def delayed_labels(events: Iterable[dict], missing: float = 0.0, seed: int = 42) -> Iterator[tuple[dict, dict | None]]:
    """Each event split into its point, to send now, and its label, to send later: (point, label or None).

    The point is the event without its ``y`` (the other keys, in their order);
    the label is ``{"id": <its id>, "y": <its y>}``. An event without ``y``
    (the ``unlabeled`` share) has no label; of the others, a ``missing``
    share never gets one. Those draws come from a generator of their own,
    seeded from ``seed``: the points are the events as they were, and a
    larger ``missing`` drops the same labels as a smaller one, and more.

    >>> pairs = delayed_labels([{"id": "app-0", "x": [0.5], "y": 1}, {"id": "app-1", "x": [0.2]}])
    >>> list(pairs)
    [({'id': 'app-0', 'x': [0.5]}, {'id': 'app-0', 'y': 1}), ({'id': 'app-1', 'x': [0.2]}, None)]
    """
    if not 0.0 <= missing <= 1.0:
        raise ValueError(f"missing must be a share in [0, 1], got {missing}")
    rng = random.Random(
        f"perceptron-stream delayed labels {seed}"
    )  # a str seed is hashed with SHA-512: stable across runs
    for event in events:
        point = {k: v for k, v in event.items() if k != "y"}
        if "y" not in event or event["y"] is None:
            yield point, None
            continue
        if "id" not in event:
            raise ValueError("an event needs an id to have its label sent later")
        kept = rng.random() >= missing  # one draw per labeled event, whatever the share
        yield point, ({"id": event["id"], "y": event["y"]} if kept else None)


def read_file(path: Path, dense: bool = False, unlabeled_rows: bool = False) -> Iterator[bytes]:
    """The messages of a CSV or JSONL file, as wire-format JSON bytes.

    JSONL lines are passed on as they are (a bad line is the consumer's to
    reject); CSV rows become ``{"id", "features", "y"}`` events, or with
    ``dense`` ``{"id", "x", "y"}`` events; a row that is not one is a ValueError
    naming its line (see :func:`_csv_rows`).
    """
    for _, message in _numbered_messages(path, dense, unlabeled_rows=unlabeled_rows):
        yield message


def is_csv(path: Path) -> bool:
    """Whether :func:`read_file` reads ``path`` as CSV (anything not named .jsonl, .ndjson or .json)."""
    return Path(path).suffix.lower() not in (".jsonl", ".ndjson", ".json")


def _numbered_messages(
    path: Path, dense: bool = False, label_column: bool = False, unlabeled_rows: bool = False
) -> Iterator[tuple[int, bytes]]:
    """(line number in the file, message) for each message of :func:`read_file`."""
    path = Path(path)
    if not is_csv(path):
        with path.open("rb") as f:
            for lineno, line in enumerate(f, start=1):
                line = line.strip()
                if line:
                    yield lineno, line
        return
    for lineno, row in _csv_rows(path, dense, label_column, unlabeled_rows):
        yield lineno, json.dumps(row, allow_nan=False).encode()


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


#: Separators a spreadsheet may have written instead of ",", by the name an error gives them.
OTHER_SEPARATORS = {";": "';' (semicolon)", "\t": "tab", "|": "'|' (pipe)"}


def _check_header(path: Path, fieldnames: Sequence[str] | None, first_line: str) -> list[str]:
    """The header's column names, or a ValueError when the file has none or is not comma-separated."""
    if not fieldnames:
        raise ValueError(f"{path} is empty; a CSV needs a header row")
    if len(fieldnames) == 1 and any(sep in first_line for sep in OTHER_SEPARATORS):
        try:
            separator = csv.Sniffer().sniff(first_line, delimiters="".join(OTHER_SEPARATORS)).delimiter
        except csv.Error:  # the sniffer gives up on some one-line samples: the most frequent candidate, then
            separator = max(OTHER_SEPARATORS, key=first_line.count)
        raise ValueError(
            f"{path}: the header {first_line.strip()!r} is one column: the file is separated by "
            f"{OTHER_SEPARATORS[separator]}, and CSV files are read comma-separated: save or export it "
            "with ',' between columns (and '.' as the decimal point)"
        )
    seen: dict[str, int] = {}
    for number, name in enumerate(fieldnames, start=1):
        if not name.strip():  # a trailing comma in the header is a column named "": a feature nobody meant
            raise ValueError(f"{path}: column {number} of the header has no name; every column needs one")
        if name in seen:  # csv.DictReader would keep the last cell of the two and drop the other silently
            raise ValueError(f"{path}: the header names {name!r} twice (columns {seen[name]} and {number})")
        seen[name] = number
    return list(fieldnames)


def csv_columns(path: Path) -> list[str]:
    """The column names of a CSV file's header (a byte-order mark left out); ValueError as :func:`_csv_rows` gives.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (Path(d) / "a.csv").write_bytes("\\ufeffage,salary,y\\n31,52000,1\\n".encode())  # Excel's "CSV UTF-8"
    ...     csv_columns(Path(d) / "a.csv")
    ['age', 'salary', 'y']
    """
    with Path(path).open(newline="", encoding="utf-8-sig") as f:
        first = f.readline()
        return _check_header(path, next(csv.reader([first]), None), first)


def _csv_rows(
    path: Path, dense: bool = False, label_column: bool = False, unlabeled_rows: bool = False
) -> Iterator[tuple[int, dict]]:
    """(line number, event) for each row of a CSV file with a header; a ValueError naming ``file:line`` for a row
    that is not an event.

    utf-8-sig: a byte-order mark, which Excel writes at the start of a "CSV
    UTF-8" file, is skipped; read as utf-8 it became part of the first
    column's name (``\\ufeffage``), a feature no event ever shares.
    ``label_column``: a header without ``y`` is an error naming the columns
    found (``train`` needs labels); otherwise its rows are unlabeled events.
    ``dense``: the feature columns' values, in column order, as ``x``.

    Refused, each naming the line: a row with fewer or more cells than the header, a value that is not a finite
    number (``nan``, ``inf`` and ``1e400`` are numbers to ``float`` but not to JSON, nor to a model), a cell over
    the csv module's field limit, and, where the header has ``y``, a row whose ``y`` is empty, unless
    ``unlabeled_rows`` (``produce --unlabeled-rows``) sends such a row unlabeled: a label lost in an export is
    otherwise sent on as an event that is only predicted, which nobody would notice.
    """
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        try:
            fields = reader.fieldnames
        except csv.Error as exc:  # a header cell over the field limit
            raise ValueError(f"{path}:1: {exc}") from None
        columns = _check_header(
            path, fields, fields[0] if fields and len(fields) == 1 else ""
        )  # one column: the whole line
        if label_column and "y" not in columns:
            like = [c for c in columns if c.strip().lower() in ("y", "label", "target", "class", "outcome")]
            hint = f" (rename {like[0]!r} to y)" if like else ""
            raise ValueError(
                f"{path}: no label column: the header has {', '.join(map(repr, columns))}, and the label "
                f"(-1/+1, 0/1 or false/true) is expected in a column named y{hint}"
            )
        rows, lineno = iter(reader), reader.line_num
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:  # "field larger than field limit (131072)": a row, not a traceback
                # the row starts on the line after the last one read whole (line_num lags inside the bad row)
                raise ValueError(f"{path}:{lineno + 1}: {exc}") from None
            lineno = reader.line_num  # the row's last line (a quoted cell may span lines)
            try:
                yield lineno, _csv_event(row, columns, dense, unlabeled_rows)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None


def _csv_event(row: dict, columns: list[str], dense: bool, unlabeled_rows: bool) -> dict:
    """One CSV row (as csv.DictReader gives it) as an event; a ValueError saying what is wrong with it.

    >>> _csv_event({"id": "a", "age": "31", "y": "1"}, ["id", "age", "y"], False, False)
    {'id': 'a', 'features': {'age': 31.0}, 'y': 1}
    >>> _csv_event({"age": "nan", "y": "1"}, ["age", "y"], False, False)
    Traceback (most recent call last):
    ...
    ValueError: column 'age': 'nan' is not a finite number
    >>> _csv_event({"age": "31", "y": ""}, ["age", "y"], False, True)
    {'features': {'age': 31.0}}
    """
    if None in row:  # more cells than the header has columns
        raise ValueError(f"{len(columns) + len(row[None])} cells, and the header has {len(columns)} columns")
    if any(value is None for value in row.values()):  # fewer: csv.DictReader fills the missing cells with None
        cells = sum(value is not None for value in row.values())
        raise ValueError(f"{cells} cells, and the header has {len(columns)} columns")
    event: dict = {}
    if "id" in row:
        event["id"] = row.pop("id")
    labeled = "y" in row
    label = row.pop("y", None)
    values = {}
    for name, text in row.items():
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"column {name!r}: {text!r} is not a finite number")
        values[name] = value
    if dense:
        event["x"] = list(values.values())
    else:
        event["features"] = values
    if label is not None and label.strip():
        event["y"] = csv_label(label)
    elif labeled and not unlabeled_rows:
        raise ValueError(
            "y is empty, and the header has a y column (produce --unlabeled-rows sends such rows unlabeled)"
        )
    return event


class Dataset(NamedTuple):
    """A labeled file for the batch algorithms: the points, their labels, the features' names and their form."""

    X: list[list[float]]
    y: list[int]
    names: list[str]  # the named features; x0..x{d-1} for dense x
    form: str  # "dense": x (the service numbers its values 0..d-1); "named": features by name


def load_dataset(path: Path, dense: bool = False) -> Dataset:
    """A labeled file as a :class:`Dataset` for the batch algorithms.

    A CSV's feature columns are named features, or with ``dense`` a dense
    ``x`` in column order; a JSONL file's events say their form themselves.

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
    for lineno, raw in _numbered_messages(path, dense, label_column=True):
        where = f"{path}:{lineno}"
        try:
            event = InputEvent.model_validate_json(raw)
        except ValueError as exc:
            raise ValueError(
                f"{where}: invalid event: {exc.errors(include_url=False)[0]['msg'] if hasattr(exc, 'errors') else exc}"
            ) from None
        if event.y is None:
            raise ValueError(f"{where}: the event has no label; train needs labeled data")
        form = "features" if event.features is not None else "x"
        size = len(event.x) if event.x is not None else 0
        if dense and form == "features":
            raise ValueError(
                f"{where}: the event names its features, and --dense reads a CSV's columns as a dense x: "
                "drop --dense, or write the events with x"
            )
        if first is None:
            first = (lineno, form, size)
        elif form != first[1]:
            raise ValueError(
                f"{where}: the event has {form!r} but the first event (line {first[0]}) has {first[1]!r}; "
                "a file must hold dense (x) events only or named (features) events only"
            )
        elif form == "x" and size != first[2]:
            raise ValueError(f"{where}: x has {size} values but the first event (line {first[0]}) has {first[2]}")
        if event.features is not None:
            names.update(dict.fromkeys(event.features))
            rows.append((event.features, event.y))
        else:
            assert event.x is not None  # an InputEvent holds x or features
            rows.append((event.x, event.y))
    if not rows:
        raise ValueError(f"{path} holds no events")
    if names:
        order = list(names)
        X = [[r.get(n, 0.0) for n in order] for r, _ in rows if isinstance(r, dict)]  # every row: forms never mix
    else:
        order = [f"x{i}" for i in range(len(rows[0][0]))]
        X = [list(r) for r, _ in rows if isinstance(r, list)]  # every row (above)
    return Dataset(X, [y for _, y in rows], order, "named" if names else "dense")
