"""Tamper evidence of the audit tier (msm_mem._governance.audit.log): each direct edit of the audit
table (a flipped bit, a deleted, inserted, swapped or duplicated row, a seq gap, a forged insert,
a truncated tail, a recomputed chain) named by its first bad seq, through the CLI verifier and
the API's on either backend, and at the boundary of the pages a store hands over."""

from __future__ import annotations

import json
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from msm_mem._api.mem import MsmMem
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import AuditEvent
from msm_mem._governance.audit.verify import VerifyResult
from msm_mem._storage.base import AUDIT_PAGE_ROWS, WriteBatch
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, RawDb, copy_store, raw_db
from tests.helpers import png as _png
from tests.layers import open_layers
from tests.test_audit_log import ANSWER, PATIENT, QUESTION, T0

# tamper evidence ------------------------------------------------------------------------------


def _shift(con: RawDb, from_seq: int, by: int = 1) -> None:
    """Renumber rows with seq >= from_seq by +by (through negative seqs to dodge the primary key)."""
    con.execute("UPDATE audit SET seq = -(seq + ?) WHERE seq >= ?", (by, from_seq))
    con.execute("UPDATE audit SET seq = -seq WHERE seq < 0")


def _row(con: RawDb, seq: int) -> tuple[bytes, str]:
    payload, digest = con.execute("SELECT payload, event_hash FROM audit WHERE seq = ?", (seq,)).fetchone()
    return bytes(payload), str(digest)


def _flip(con: RawDb, k: int) -> None:
    payload, _ = _row(con, k)
    data = bytearray(payload)
    data[len(data) // 2] ^= 0x01
    con.execute("UPDATE audit SET payload = ? WHERE seq = ?", (bytes(data), k))


def _delete(con: RawDb, k: int) -> None:
    con.execute("DELETE FROM audit WHERE seq = ?", (k,))


def _insert_garbage(con: RawDb, k: int) -> None:
    payload, digest = _row(con, 1)
    _shift(con, k)
    con.execute("INSERT INTO audit VALUES (?, ?, ?, 'default')", (k, payload, digest))


def _swap(con: RawDb, k: int) -> None:
    a, b = _row(con, k), _row(con, k + 1)
    con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (*b, k))
    con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (*a, k + 1))


def _duplicate(con: RawDb, k: int) -> None:
    row = _row(con, k)
    _shift(con, k + 1)
    con.execute("INSERT INTO audit VALUES (?, ?, ?, 'default')", (k + 1, *row))


def _gap(con: RawDb, k: int) -> None:
    _shift(con, k)


#: tampering -> the first bad seq the verifier must name when event k is attacked
TAMPER: dict[str, tuple[Callable[[RawDb, int], None], int]] = {
    "bit_flip": (_flip, 0),
    "deleted": (_delete, 0),
    "inserted": (_insert_garbage, 0),
    "swapped": (_swap, 0),
    "duplicated": (_duplicate, 1),
    "seq_gap": (_gap, 0),
}


def _mallory(builder: ChainBuilder) -> AuditEvent:
    """The next event of ``builder``: a read by "mallory", validly hashed and linked."""
    return builder.next(
        time=T0,
        actor="mallory",
        role="admin",
        action="read",
        source_tier="ltm",
        target_tier="stm",
        purpose="treatment",
        outcome="success",
    )


def _forge_insert(con: RawDb, k: int) -> None:
    """Insert a forged event at slot ``k`` with a valid hash and link to its predecessor."""
    forged = _mallory(ChainBuilder(k - 1, _row(con, k - 1)[1]))
    _shift(con, k)
    con.execute("INSERT INTO audit VALUES (?, ?, ?, 'default')", forged.row())


def _store_with_events(tmp_path: Path, new_mem: MemFactory | None = None) -> tuple[Path, int]:
    """A closed store with three answered turns (SQLite, or of the backend of ``new_mem``); its head seq."""
    directory = tmp_path / "s"
    options = {"clock": FixedClock(T0), "backbone": FixedBackbone(ANSWER, "follow up in 3 months")}
    mem = MsmMem.init(directory, ADMIN, **options) if new_mem is None else new_mem("s", **options)
    for seed in (1, 2, 3):
        mem.ask(AGENT, PATIENT, _png(tmp_path, seed), QUESTION, study_id=f"ACC-{seed}")
    mem.close()
    with open_layers(directory) as layers:
        head = layers.store.audit_head()[0]
    return directory, head


def _verify_cli(directory: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["audit", "verify", str(directory), *AUDITOR_FLAGS])
    return code, capsys.readouterr().out


def test_verify_intact_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An untouched store verifies: exit 0 and the event count."""
    directory, head = _store_with_events(tmp_path)
    code, out = _verify_cli(directory, capsys)
    assert code == 0 and f"intact: {head} events" in out
    assert main(["audit", "verify", "--hashes-only", str(directory), *AUDITOR_FLAGS]) == 0


@pytest.mark.parametrize("name", sorted(TAMPER))
def test_verify_names_first_bad_seq(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Each direct edit of the audit table makes verify exit non-zero naming the first bad seq."""
    directory, head = _store_with_events(tmp_path)
    k = head // 2
    tamper, offset = TAMPER[name]
    con = raw_db(directory)
    tamper(con, k)
    con.close()
    code, out = _verify_cli(directory, capsys)
    assert code != 0
    assert f"first bad seq {k + offset}:" in out
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem.verify_audit(AUDITOR, full=full)
            assert not result.ok and result.first_bad_seq == k + offset


def test_forged_insert_with_valid_links_names_the_next_slot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An inserted event forged with a valid hash and link to its predecessor is caught at the slot after it."""
    directory, head = _store_with_events(tmp_path)
    k = head // 2
    con = raw_db(directory)
    _forge_insert(con, k)
    con.close()
    code, out = _verify_cli(directory, capsys)
    assert code != 0 and f"first bad seq {k + 1}:" in out


def test_truncated_tail_after_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deleting the last events after a checkpoint names the first missing seq."""
    directory, head = _store_with_events(tmp_path)
    assert main(["audit", "checkpoint", str(directory), *AUDITOR_FLAGS]) == 0
    con = raw_db(directory)
    con.execute("DELETE FROM audit WHERE seq > ?", (head - 3,))
    con.close()
    capsys.readouterr()
    code, out = _verify_cli(directory, capsys)
    assert code != 0 and f"first bad seq {head - 2}:" in out and "truncated" in out


def test_recomputed_chain_after_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Events rewritten with valid hashes pass the chain check but not the signed checkpoint."""
    directory, head = _store_with_events(tmp_path)
    with open_layers(directory, clock=FixedClock(T0)) as layers:
        layers.audit.checkpoint()
    con = raw_db(directory)
    k = head // 2
    builder = ChainBuilder(k - 1, _row(con, k - 1)[1])
    for seq in range(k, head + 1):
        event = AuditEvent.from_row(seq, *_row(con, seq))
        names = (
            "time",
            "role",
            "action",
            "source_tier",
            "target_tier",
            "purpose",
            "outcome",
            "record_ids",
            "patient",
            "consent_id",
            "reason",
        )
        rewritten = builder.next(actor="mallory", **{f: getattr(event, f) for f in names})
        sql = "UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?"
        con.execute(sql, (rewritten.payload(), rewritten.event_hash, seq))
    con.close()
    with MsmMem.open(directory) as mem:
        chain_only = mem.verify_audit(AUDITOR)
        assert not chain_only.ok
    code, out = _verify_cli(directory, capsys)
    first = _first_unproven(directory, head // 2)
    assert code != 0 and f"first bad seq {first}:" in out and "edited and rehashed" in out


def _first_unproven(directory: Path, k: int) -> int:
    """The first bad seq of an edit at event ``k`` and a recomputed chain from there: every commit
    is signed, so it is the first event after the last checkpoint below ``k`` (at most ``k``)."""
    sizes = [json.loads(line)["size"] for line in (directory / "audit" / "checkpoints.jsonl").read_text().splitlines()]
    first = max(size for size in sizes if size < k) + 1
    assert first <= k
    return first


# the same edits on either backend, found by the API's verifier --------------------------------


@pytest.mark.parametrize("name", sorted(TAMPER))
def test_verify_api_names_first_bad_seq(tmp_path: Path, new_mem: MemFactory, name: str) -> None:
    """Each direct edit of the audit table (either backend) makes verify, full and hashes-only,
    name the first bad seq."""
    directory, head = _store_with_events(tmp_path, new_mem)
    k = head // 2
    tamper, offset = TAMPER[name]
    with raw_db(directory) as con:
        tamper(con, k)
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem.verify_audit(AUDITOR, full=full)
            assert (result.ok, result.first_bad_seq) == (False, k + offset), (full, result)


def test_verify_api_catches_a_forged_insert_at_the_next_slot(tmp_path: Path, new_mem: MemFactory) -> None:
    """An inserted event forged with a valid hash and link to its predecessor is caught at the slot after it."""
    directory, head = _store_with_events(tmp_path, new_mem)
    k = head // 2
    with raw_db(directory) as con:
        _forge_insert(con, k)
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem.verify_audit(AUDITOR, full=full)
            assert (result.ok, result.first_bad_seq) == (False, k + 1), (full, result)


def test_verify_api_names_a_truncated_tail_after_checkpoint(tmp_path: Path, new_mem: MemFactory) -> None:
    """Deleting the last events after a checkpoint names the first missing seq."""
    directory, head = _store_with_events(tmp_path, new_mem)
    with open_layers(directory, clock=FixedClock(T0)) as layers:
        layers.audit.checkpoint()
    with raw_db(directory) as con:
        con.execute("DELETE FROM audit WHERE seq > ?", (head - 3,))
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem.verify_audit(AUDITOR, full=full)
            assert (result.ok, result.first_bad_seq) == (False, head - 2), (full, result)
            assert "truncated" in result.reason


def test_verify_api_catches_a_recomputed_chain_by_its_checkpoint(tmp_path: Path, new_mem: MemFactory) -> None:
    """Events rewritten with valid hashes and links pass the chain walk but not the signed checkpoint."""
    directory, head = _store_with_events(tmp_path, new_mem)
    with open_layers(directory, clock=FixedClock(T0)) as layers:
        layers.audit.checkpoint()
    with raw_db(directory) as con:
        _recompute(con, head // 2)
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem.verify_audit(AUDITOR, full=full)
            assert (result.ok, result.first_bad_seq) == (False, _first_unproven(directory, head // 2)), (full, result)
            assert "edited and rehashed" in result.reason


# verification across the pages a store hands over -------------------------------------------

PAGE = AUDIT_PAGE_ROWS


@pytest.fixture(scope="module")
def paged(
    tmp_path_factory: pytest.TempPathFactory, module_backend: str, init_options: Callable[..., dict[str, Any]]
) -> Path:
    """A store of PAGE + 50 events, checkpointed at the last row of the first page, the first
    row of the second page and the head (one per backend)."""
    directory = tmp_path_factory.mktemp("paged") / "s"
    MsmMem.init(directory, ADMIN, **init_options(module_backend, clock=FixedClock(T0))).close()
    with open_layers(directory, clock=FixedClock(T0)) as layers:
        for size in (PAGE, PAGE + 1, PAGE + 50):
            specs = [
                layers.audit.spec(
                    actor="rad-1",
                    role="clinician",
                    action="read",
                    source_tier="ltm",
                    target_tier="stm",
                    purpose="treatment",
                    record_ids=[f"E-{i}"],
                )
                for i in range(size - layers.store.audit_head()[0])
            ]
            layers.audit.write(WriteBatch(), specs)
            assert layers.audit.checkpoint()[0] == size
    return directory


def _copy(directory: Path, tmp_path: Path) -> Path:
    return copy_store(directory, tmp_path / "copy")


def _relink(con: RawDb, k: int) -> None:
    """Point event k's prev_hash elsewhere and store the matching event_hash."""
    payload, _ = _row(con, k)
    at = payload.index(b'"prev_hash":"') + 13
    forged = payload[:at] + b"f" * 64 + payload[at + 64 :]
    con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (forged, sha256(forged).hexdigest(), k))


def _recompute(con: RawDb, k: int) -> None:
    """Rewrite events k.. with valid hashes and links (caught only by the checkpoints)."""
    builder = ChainBuilder(k - 1, _row(con, k - 1)[1])
    for (seq,) in con.execute("SELECT seq FROM audit WHERE seq >= ? ORDER BY seq", (k,)).fetchall():
        rewritten = _mallory(builder)
        con.execute(
            "UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?",
            (rewritten.payload(), rewritten.event_hash, seq),
        )


#: tampering at the page boundary -> (event attacked, first bad seq)
PAGE_TAMPER: dict[str, tuple[Callable[[RawDb, int], object], int, int]] = {
    "bit_flip": (_flip, PAGE + 1, PAGE + 1),
    "prev_hash": (_relink, PAGE + 1, PAGE + 1),
    "deleted": (_delete, PAGE, PAGE),
    "swapped": (_swap, PAGE, PAGE),
    "truncated": (lambda con, k: con.execute("DELETE FROM audit WHERE seq >= ?", (k,)), PAGE + 21, PAGE + 21),
    "recomputed": (_recompute, PAGE + 1, PAGE + 1),
}


def test_verify_walks_pages_and_reads_checkpoints_on_both_sides(paged: Path, tmp_path: Path) -> None:
    """A chain longer than a page verifies in both modes, checkpoints at either side of the boundary included."""
    with open_layers(_copy(paged, tmp_path)) as layers:
        head = layers.store.audit_head()
        assert head[0] == PAGE + 50
        for full in (True, False):
            assert layers.audit.verify(full=full) == VerifyResult(True, *head, None, "")


@pytest.mark.parametrize("name", sorted(PAGE_TAMPER))
def test_tampering_at_a_page_boundary_names_first_bad_seq(paged: Path, tmp_path: Path, name: str) -> None:
    """Edits next to the page boundary are found by both modes, naming the same first bad seq."""
    directory = _copy(paged, tmp_path)
    tamper, k, bad = PAGE_TAMPER[name]
    con = raw_db(directory)
    tamper(con, k)
    con.close()
    with open_layers(directory) as layers:
        for full in (True, False):
            result = layers.audit.verify(full=full)
            assert (result.ok, result.first_bad_seq) == (False, bad), (full, result)
