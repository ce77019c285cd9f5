"""The embedded store's side connection: audit rows alone commit there, and the reads of other
threads do not wait for that commit; every other write stays on the store's connection."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from msm_mem import IllegalTransition, Impression, SemanticState, StoreError
from msm_mem._storage.base import WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._storage.sqlite.connection import audit_only
from msm_mem._tier_records import AuditRow
from tests.conftest import with_codec


def _store(path: Path) -> SqliteStore:
    store = with_codec(SqliteStore.create(path, dim=4, encoder="t"))
    state = SemanticState("S-1", "P1", "impression", (Impression(1e9, "old", ""),), 1, created_at=1e9)
    store.write(WriteBatch(semantic=[state]))
    return store


def _rows(first: int, n: int = 1) -> list[AuditRow]:
    return [AuditRow(seq, b"e%d" % seq, f"{seq:064x}") for seq in range(first, first + n)]


def test_only_batches_of_audit_rows_alone_go_to_the_side() -> None:
    """A batch with anything but audit rows (or a restore) is an ordinary write."""
    assert audit_only(WriteBatch()) and audit_only(WriteBatch(audit=_rows(1)))
    assert not audit_only(WriteBatch(audit=_rows(1), shred_keys=["P1"]))
    assert not audit_only(WriteBatch(audit=_rows(1), restore=True))
    assert not audit_only(WriteBatch(stm_changes=[object()]))  # type: ignore[list-item]


def test_reads_go_on_while_audit_rows_commit(tmp_path: Path) -> None:
    """While a write of audit rows waits inside its transaction (as for its syncs), another
    thread reads the cache, the rows and the vectors, and a second writer waits its turn."""
    store = _store(tmp_path / "s")
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        assert release.wait(30)

    writer = threading.Thread(target=store.write, args=(WriteBatch(audit=_rows(1)),), kwargs={"before_commit": hold})
    writer.start()
    assert inside.wait(30)
    read: list[object] = []

    def reader() -> None:
        read.append(store.semantic_active("P1")[0].state_id)
        read.append(store.search("episodic", np.full(4, 0.5, np.float32), 1, "P1"))
        read.append(store.audit_head())

    thread = threading.Thread(target=reader)
    thread.start()
    thread.join(30)
    done_while_held = not thread.is_alive()
    second = threading.Thread(target=store.write, args=(WriteBatch(audit=_rows(2)),))
    second.start()
    second.join(0.2)
    second_waited = second.is_alive()
    release.set()
    writer.join(30)
    second.join(30)
    thread.join(30)
    assert done_while_held
    assert read == ["S-1", [], (0, "0" * 64)]  # the uncommitted rows are not seen
    assert second_waited  # writers keep one order
    assert store.audit_head() == (2, f"{2:064x}")
    store.close()


def test_a_failed_write_of_audit_rows_stores_nothing(tmp_path: Path) -> None:
    """A row over a stored one is refused, and a failure before the commit rolls back: the
    next write continues the chain."""
    store = _store(tmp_path / "s")
    store.write(WriteBatch(audit=_rows(1)))
    with pytest.raises(IllegalTransition, match="append-only"):
        store.write(WriteBatch(audit=_rows(1)))

    def fail() -> None:
        raise OSError("the head file could not be written")

    with pytest.raises(OSError):
        store.write(WriteBatch(audit=_rows(2)), before_commit=fail)
    assert store.audit_head() == (1, f"{1:064x}")
    store.write(WriteBatch(audit=_rows(2, 2)))
    assert [r.seq for r in store.iter_audit()] == [1, 2, 3]
    store.close()
    reopened = SqliteStore.open(tmp_path / "s")
    assert reopened.audit_head() == (3, f"{3:064x}")
    reopened.close()


def test_a_writer_waiting_while_the_store_closes_gets_a_clear_error(tmp_path: Path) -> None:
    """A write of audit rows queued behind another write, when the store is closed meanwhile,
    either commits before the close or fails as a closed store: never on a closed connection."""
    store = _store(tmp_path / "s")
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        assert release.wait(30)

    state = SemanticState("S-2", "P1", "impression", (Impression(2e9, "new", ""),), 2, created_at=2e9, supersedes="S-1")
    first = threading.Thread(target=store.write, args=(WriteBatch(semantic=[state]),), kwargs={"before_commit": hold})
    first.start()
    assert inside.wait(30)
    outcome: list[object] = []

    def queued() -> None:
        try:
            store.write(WriteBatch(audit=_rows(1)))
            outcome.append("stored")
        except StoreError as exc:
            outcome.append(str(exc))

    second = threading.Thread(target=queued)
    second.start()
    closing = threading.Thread(target=store.close)
    closing.start()
    release.set()
    for thread in (first, second, closing):
        thread.join(30)
    assert outcome in (["stored"], ["the store is closed"])
    reopened = SqliteStore.open(tmp_path / "s")
    assert reopened.audit_head()[0] == (1 if outcome == ["stored"] else 0)
    reopened.close()
