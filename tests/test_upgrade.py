"""A store written by an older msm-mem (store schema 1: visual tags in clear text, no row
digests, an audit head no checkpoint signs, no tenant column) is refused with the command that upgrades it; the
upgrade (an admin's, audited) checks the chain, encrypts the clear tags, computes the row
digests and adopts the head in one transaction, so a kill before its commit leaves the old
store as it was. The old store is made here from a new one, its columns rewritten with SQL
as the older version wrote them (synthetic data only)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from msm_mem import AccessDenied, ManifestRow, MsmMem, StoreError
from msm_mem._errors import AuditChainBroken
from msm_mem._governance.crypto import is_token
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, SYSTEM, audit_events, png, raw_sql
from tests.legacy_layout import to_schema_2

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"


def _old_store(tmp_path: Path, new_mem: MemFactory) -> Path:
    """A closed store as the older version left it: visual tags "PA"/"AP" in clear text, meta
    at schema 1 without row digests, no checkpoint log or head file (it signed every 10,000
    events); a shredded patient's clear tag among them."""
    mem = new_mem("old", clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "follow up"))
    rows = [
        ManifestRow(f"P-OLD-{i % 3}", f"S{i}", T0 - 86400 * i, str(png(tmp_path, i)), QUESTION, "effusion", view=view)
        for i, view in enumerate(["PA", "AP", "PA", "AP", "PA", "AP"])
    ]
    mem.ingest(SYSTEM, rows)
    mem.ask(AGENT, "P-OLD-1", png(tmp_path, 9), QUESTION, study_id="ACC-9")
    mem.shred(ADMIN, "P-OLD-2", "erasure request")
    directory = mem.directory
    mem.close()
    to_schema_2(directory)
    for rid, pos in raw_sql(directory, "SELECT id, pos FROM visual"):
        raw_sql(directory, "UPDATE visual SET visual_tag = ? WHERE id = ?", ("PA" if pos % 2 == 0 else "AP", rid))
    raw_sql(directory, "DELETE FROM meta WHERE key LIKE 'rows:%'")
    raw_sql(directory, "UPDATE meta SET value = '1' WHERE key = 'schema'")
    for name in ("checkpoints.jsonl", "checkpoints.head"):
        (directory / "audit" / name).unlink()
    return directory


def _still_old(directory: Path) -> None:
    with pytest.raises(StoreError, match="msm-mem store upgrade"):
        MsmMem.open(directory)
    tags = {tag for (tag,) in raw_sql(directory, "SELECT visual_tag FROM visual")}
    assert tags == {"PA", "AP"}
    assert raw_sql(directory, "SELECT value FROM meta WHERE key = 'schema'") == [("1",)]
    assert raw_sql(directory, "SELECT count(*) FROM meta WHERE key LIKE 'rows:%'") == [(0,)]


def test_an_old_store_is_refused_naming_the_upgrade(tmp_path: Path, new_mem: MemFactory) -> None:
    """Opening an old store fails with the command that upgrades it, and changes nothing."""
    directory = _old_store(tmp_path, new_mem)
    _still_old(directory)


def test_the_upgrade_makes_an_old_store_current(tmp_path: Path, new_mem: MemFactory) -> None:
    """The upgrade encrypts every clear tag (a shredded patient's reads as shredded, never in
    clear), adopts the head with an audited checkpoint and row digests; then the store opens,
    verifies, reads its tags back, takes writes, and a second upgrade has nothing to do."""
    directory = _old_store(tmp_path, new_mem)
    events = int(raw_sql(directory, "SELECT max(seq) FROM audit")[0][0])
    result = MsmMem.upgrade(directory, ADMIN)
    assert result == {
        "from_schema": 1,
        "to_schema": 3,
        "visual_tags_encrypted": 6,
        "events_signed": events + 1,
        "keys_moved": 2,
    }
    assert all(is_token(tag) for (tag,) in raw_sql(directory, "SELECT visual_tag FROM visual"))
    with MsmMem.open(directory, clock=FixedClock(T0 + 60)) as mem:
        assert mem.verify_audit(AUDITOR).ok
        assert sorted(v.visual_tag for v in mem.visuals(CLINICIAN, "P-OLD-0")) == ["AP", "PA"]
        upgrades = [e for e in audit_events(mem) if e.action == "store_upgrade"]
        assert [(e.seq, e.actor, e.role) for e in upgrades] == [(events + 1, ADMIN.id, "admin")]
        mem.ask(AGENT, "P-OLD-1", png(tmp_path, 10), QUESTION, study_id="ACC-10")
        assert mem.verify_audit(AUDITOR).ok
    shredded = raw_sql(directory, "SELECT visual_tag FROM visual WHERE patient_id = '' AND state = 'retracted'")
    assert shredded and all(is_token(tag) for (tag,) in shredded)  # the erased rows
    with pytest.raises(StoreError, match="nothing to upgrade"):
        MsmMem.upgrade(directory, ADMIN)


def test_only_an_admin_upgrades(tmp_path: Path, new_mem: MemFactory) -> None:
    """Any other role is refused before the store is touched."""
    directory = _old_store(tmp_path, new_mem)
    for who in (AUDITOR, SYSTEM, CLINICIAN):
        with pytest.raises(AccessDenied):
            MsmMem.upgrade(directory, who)
    _still_old(directory)


def test_an_old_chain_that_fails_is_not_adopted(tmp_path: Path, new_mem: MemFactory) -> None:
    """An event edited in the old chain: the upgrade names its seq and changes nothing."""
    directory = _old_store(tmp_path, new_mem)
    payload = bytes(raw_sql(directory, "SELECT payload FROM audit WHERE seq = 3")[0][0])
    raw_sql(directory, "UPDATE audit SET payload = ? WHERE seq = 3", (payload.replace(b'"actor":"', b'"actor":"x'),))
    with pytest.raises(AuditChainBroken) as caught:
        MsmMem.upgrade(directory, ADMIN)
    assert caught.value.seq == 3
    _still_old(directory)


def _upgrade_and_die(directory: Path) -> None:  # pragma: no cover  (runs in the child)
    import msm_mem._governance.audit.log as audit

    def killed(*_: object) -> None:  # SIGKILL just before the upgrade's transaction commits
        os.kill(os.getpid(), signal.SIGKILL)

    audit.write_head = killed  # type: ignore[assignment]
    MsmMem.upgrade(directory, ADMIN)


def test_a_kill_before_the_commit_leaves_the_old_store(tmp_path: Path, new_mem: MemFactory, backend: str) -> None:
    """The upgrading process killed (SIGKILL) inside its transaction: the store is the old
    one, untouched, and a second upgrade succeeds."""
    directory = _old_store(tmp_path, new_mem)
    child = multiprocessing.get_context("fork").Process(target=_upgrade_and_die, args=(directory,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    _still_old(directory)
    MsmMem.upgrade(directory, ADMIN)
    with MsmMem.open(directory) as mem:
        assert mem.verify_audit(AUDITOR).ok


def test_a_schema_1_store_with_per_commit_checkpoints_is_upgraded_too(tmp_path: Path, new_mem: MemFactory) -> None:
    """A store of the version just before row digests (tags encrypted, every commit signed,
    schema 1): its checkpoints are all checked against the chain and kept; no tag changes."""
    mem = new_mem("mid", clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "follow up"))
    mem.ingest(SYSTEM, [ManifestRow("P-MID", "S1", T0, str(png(tmp_path, 1)), QUESTION, "effusion", view="PA")])
    directory = mem.directory
    mem.close()
    log = (directory / "audit" / "checkpoints.jsonl").read_bytes()
    to_schema_2(directory)
    raw_sql(directory, "DELETE FROM meta WHERE key LIKE 'rows:%'")
    raw_sql(directory, "UPDATE meta SET value = '1' WHERE key = 'schema'")
    result = MsmMem.upgrade(directory, ADMIN)
    assert result["visual_tags_encrypted"] == 0
    assert (directory / "audit" / "checkpoints.jsonl").read_bytes().startswith(log)
    with MsmMem.open(directory) as again:
        assert again.verify_audit(AUDITOR).ok
        assert [v.visual_tag for v in again.visuals(CLINICIAN, "P-MID")] == ["PA"]


def test_a_checkpoint_contradicting_the_old_chain_is_not_adopted(tmp_path: Path, new_mem: MemFactory) -> None:
    """The old chain's tail deleted while its checkpoint log remembers it: refused, nothing changes."""
    mem = new_mem("cut", clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "follow up"))
    mem.ask(AGENT, "P-CUT", png(tmp_path, 1), QUESTION, study_id="ACC-1")
    directory = mem.directory
    mem.close()
    head = int(raw_sql(directory, "SELECT max(seq) FROM audit")[0][0])
    raw_sql(directory, "DELETE FROM audit WHERE seq = ?", (head,))
    to_schema_2(directory)
    raw_sql(directory, "DELETE FROM meta WHERE key LIKE 'rows:%'")
    raw_sql(directory, "UPDATE meta SET value = '1' WHERE key = 'schema'")
    with pytest.raises(AuditChainBroken, match="contradicts the chain") as caught:
        MsmMem.upgrade(directory, ADMIN)
    assert caught.value.seq == head
    with pytest.raises(StoreError, match="msm-mem store upgrade"):
        MsmMem.open(directory)
