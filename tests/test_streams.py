"""service/streams.py: CSV files as spreadsheets write them (a byte-order mark, another separator, the label column),
and a CSV read as dense x."""

from __future__ import annotations

import json

import pytest
from perceptron_stream.streams import csv_columns, load_dataset, read_file

SEED_003 = "x1,x2,y\n1,2,1\n2,4,1\n3,4,1\n2,1,-1\n4,2,-1\n"


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    """Excel's "CSV UTF-8" starts with U+FEFF: read as utf-8 it named the first feature '\\ufeffage'."""
    data = tmp_path / "excel.csv"
    data.write_bytes("\ufeffage,salary,y\r\n31,52000,1\r\n45,18000,-1\r\n".encode())
    assert csv_columns(data) == ["age", "salary", "y"]
    assert load_dataset(data).names == ["age", "salary"]
    assert [json.loads(m) for m in read_file(data)] == [
        {"features": {"age": 31.0, "salary": 52000.0}, "y": 1},
        {"features": {"age": 45.0, "salary": 18000.0}, "y": -1},
    ]


@pytest.mark.parametrize("separator, name", [(";", "';' (semicolon)"), ("\t", "tab"), ("|", "'|' (pipe)")])
def test_another_separator_is_named(tmp_path, separator, name):
    data = tmp_path / "d.csv"
    data.write_text(f"age{separator}salary{separator}y\n31{separator}52000{separator}1\n")
    for read in (csv_columns, load_dataset, lambda path: list(read_file(path))):
        with pytest.raises(ValueError) as caught:
            read(data)
        assert f"separated by {name}" in str(caught.value) and "read comma-separated" in str(caught.value), caught.value


def test_train_needs_a_y_column_and_says_which_columns_it_found(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("age,salary,label\n31,52000,1\n")
    with pytest.raises(ValueError) as caught:
        load_dataset(data)
    assert str(caught.value) == (
        f"{data}: no label column: the header has 'age', 'salary', 'label', and the label "
        "(-1/+1, 0/1 or false/true) is expected in a column named y (rename 'label' to y)"
    )
    # replayed, such a file is unlabeled events (every column a feature): produce says so on stderr
    assert json.loads(next(read_file(data))) == {"features": {"age": 31.0, "salary": 52000.0, "label": 1.0}}


def test_a_row_longer_than_the_header_is_named(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("x1,y\n1,1\n2,1,3\n")
    with pytest.raises(ValueError, match=r"d\.csv:3: 3 cells, and the header has 2 columns"):
        load_dataset(data)


def test_dense_reads_the_feature_columns_as_x_in_order(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("id,x1,x2,y\na,1,2,1\nb,2,4,1\n")
    named, dense = load_dataset(data), load_dataset(data, dense=True)
    assert (named.X, named.y, named.form) == (dense.X, dense.y, "named") == ([[1.0, 2.0], [2.0, 4.0]], [1, 1], "named")
    assert (dense.names, dense.form) == (["x0", "x1"], "dense")
    assert [json.loads(m) for m in read_file(data, dense=True)] == [
        {"id": "a", "x": [1.0, 2.0], "y": 1},
        {"id": "b", "x": [2.0, 4.0], "y": 1},
    ]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"features": {"a": 1}, "y": 1}\n')
    with pytest.raises(ValueError, match="--dense reads a CSV's columns as a dense x"):
        load_dataset(jsonl, dense=True)
    jsonl.write_text('{"x": [1, 2], "y": 1}\n')
    assert load_dataset(jsonl).form == load_dataset(jsonl, dense=True).form == "dense"


@pytest.mark.parametrize(
    "text, line, reason",
    [
        ("a,y\n1,1\nnan,1\n", 3, "column 'a': 'nan' is not a finite number"),
        ("a,y\ninf,1\n", 2, "column 'a': 'inf' is not a finite number"),
        ("a,y\n1,1\n1e400,-1\n", 3, "column 'a': '1e400' is not a finite number"),
        ("a,b,y\n1,2,1\n1,2\n", 3, "2 cells, and the header has 3 columns"),
        ("a,y\n1,1\n2,\n", 3, "y is empty, and the header has a y column"),
        ("a,y\n1," + "9" * 200_000 + "\n", 2, "field larger than field limit"),
    ],
    ids=["nan", "inf", "overflow", "short-row", "empty-y", "over-long-field"],
)
def test_a_row_that_is_not_an_event_is_refused_naming_its_line(tmp_path, text, line, reason):
    """Each of these was sent before: NaN/Infinity (invalid JSON), a row short of y or with an empty y unlabeled, or a
    raw _csv.Error traceback."""
    data = tmp_path / "d.csv"
    data.write_text(text)
    with pytest.raises(ValueError) as caught:
        list(read_file(data))
    assert str(caught.value).startswith(f"{data}:{line}: {reason}"), caught.value


@pytest.mark.parametrize(
    "header, reason",
    [
        ("a,b,\n", "column 3 of the header has no name; every column needs one"),
        ("a,b,a,y\n", "the header names 'a' twice (columns 1 and 3)"),
    ],
    ids=["trailing-empty-name", "duplicate"],
)
def test_a_header_with_an_empty_or_a_repeated_name_is_refused(tmp_path, header, reason):
    data = tmp_path / "d.csv"
    data.write_text(header + "1,2,3" + (",1" if header.count(",") == 3 else "") + "\n")
    for read in (csv_columns, load_dataset, lambda path: list(read_file(path))):
        with pytest.raises(ValueError) as caught:
            read(data)
        assert str(caught.value) == f"{data}: {reason}", caught.value


def test_an_empty_y_is_sent_unlabeled_only_when_asked(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("id,a,y\np,1,1\nq,2,\n")
    assert [json.loads(m) for m in read_file(data, unlabeled_rows=True)] == [
        {"id": "p", "features": {"a": 1.0}, "y": 1},
        {"id": "q", "features": {"a": 2.0}},
    ]
    with pytest.raises(ValueError, match=r"d\.csv:3: y is empty"):
        load_dataset(data)  # train needs every label, flag or not
