"""The rows on disk and their undo log: a change is undone back to the checkpoint before it, once per epoch."""

from __future__ import annotations

from perceptron_stream.state.pending.undo import KEEP_EPOCHS, UndoTable


def _rows(table: UndoTable) -> dict:
    return {k: (s, a) for k, s, a in table.db.execute("SELECT id, state, at FROM pending")}


def test_changes_after_a_checkpoint_are_undone_and_the_first_change_of_an_old_row_alone_is_logged():
    table = UndoTable(":memory:", track_changes=True)
    table.put({"s:a": ("pending", 1.0, b"{}", 1), "s:b": ("pending", 2.0, b"{}", 2)}, replacing=set())
    table.checkpoint(1)
    assert table.epoch == 2 and table.changed == set()
    table.mark_labeled([(3.0, 2, "s:a")], [(2, "s:a", b'["pending", 1.0, "{}", 1]')])
    table.delete(
        "s:a"
    )  # changed in this epoch already: logged once, the value at the checkpoint is what a restore needs
    table.delete("s:b")
    table.put({"s:c": ("pending", 4.0, b"{}", 3)}, replacing=set())
    assert table.changed == {"s:a", "s:b", "s:c"}
    assert [i for (i,) in table.db.execute("SELECT id FROM undo ORDER BY seq")] == ["s:a", "s:b"]  # s:c: new
    table.commit()
    table.rollback_to(1)
    assert _rows(table) == {"s:a": ("pending", 1.0), "s:b": ("pending", 2.0)} and table.epoch == 2


def test_a_checkpoint_purges_undo_older_than_a_store_keeps():
    table = UndoTable(":memory:")
    table.put({"s:a": ("pending", 1.0, b"{}", 1)}, replacing=set())
    last = KEEP_EPOCHS + 2
    for seq in range(1, last + 1):  # a change of the row in every epoch
        table.checkpoint(seq)
        table.put({"s:a": ("pending", float(seq), b"{}", 1)}, replacing={"s:a"})
    epochs = [e for (e,) in table.db.execute("SELECT epoch FROM undo ORDER BY epoch")]
    assert epochs == list(
        range(last - KEEP_EPOCHS + 1, last + 2)
    )  # the last KEEP_EPOCHS checkpoints', and the open one


def test_load_replaces_everything_as_of_a_checkpoint():
    table = UndoTable(":memory:")
    table.put({"s:x": ("pending", 1.0, b"{}", 1)}, replacing=set())
    table.load({"s:a": ["labeled", 5.0, None], "s:b": ["early", 6.0, '{"y": 1}']}, epoch=4)
    assert _rows(table) == {"s:a": ("labeled", 5.0), "s:b": ("early", 6.0)} and table.epoch == 4
    assert table.count_pending() == 0 and table.early_rows() == [("s:b", 6.0, b'{"y": 1}')]
