"""Tests of the audit tier (msm_mem._governance.audit): one event per action, no identifiers or
narrative, tamper evidence through the CLI verifier, checkpoints and retention."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from msm_mem import Principal, Purpose, Role
from msm_mem._api.mem import MsmMem
from msm_mem._errors import AccessDenied, IllegalTransition, NotFound
from msm_mem._governance.audit import RETENTION_S
from msm_mem._governance.audit_chain import ChainBuilder, VerifyResult
from msm_mem._governance.audit_event import AuditEvent, AuditSpec
from msm_mem._storage.base import AUDIT_PAGE_ROWS, WriteBatch
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import ADMIN as ADMIN_FLAGS
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, SYSTEM, RawDb, audit_events, copy_store, raw_db
from tests.helpers import png as _png
from tests.test_audit_chain import VECTORS

T0 = 1_700_000_000.0
PATIENT = "MRN-PATIENT-998877"
QUESTION = "Does the zebra-striped nodule near the hilum look worse than before?"
ANSWER = "Stable zebrastripe nodule, right hilar region, no pneumonia"
CORRECTION = "Enlarging quokka-shaped nodule, recommend CT for malignancy"


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mem(tmp_path: Path, clock: FixedClock) -> Iterator[MsmMem]:
    """The store on SQLite, for the command-line test (the CLI is rebuilt on its own branch)."""
    m = MsmMem.init(tmp_path / "s", ADMIN, clock=clock, backbone=FixedBackbone(ANSWER, "follow up in 3 months"))
    yield m
    m.close()


@pytest.fixture
def any_mem(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    """The store on each backend."""
    m = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "follow up in 3 months"))
    yield m
    m.close()


def _busy(mem: MsmMem, folder: Path, clock: FixedClock) -> None:
    """Asks, a held repeat, a critic verdict, maintenance and decay: many kinds of event."""
    mem.ask(AGENT, PATIENT, _png(folder, 1), QUESTION, study_id="ACC-1")
    mem.ask(AGENT, PATIENT, _png(folder, 1), QUESTION, study_id="ACC-2")
    mem.ask(AGENT, PATIENT, _png(folder, 2), QUESTION, study_id="ACC-3")
    mem._maintainer().critic_verdict(
        Principal("rad-1", Role.CRITIC, Purpose.TREATMENT), PATIENT, "ACC-3", accept=False, correction=CORRECTION
    )
    clock.advance(2 * 86400)
    mem.maintain(SYSTEM)
    clock.advance(10 * 365 * 86400)
    mem.maintain(SYSTEM)


# what is recorded ----------------------------------------------------------------------------


def test_one_turn_records_every_step(any_mem: MsmMem, tmp_path: Path) -> None:
    """An answered turn appends consent, STM write, read, consolidation and semantic update events."""
    before = any_mem._store.audit_head()[0]
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION, study_id="ACC-1")
    new = audit_events(any_mem._store)[before:]
    actions = [e.action for e in new]
    assert actions[:3] == ["consent", "write", "read"] and actions[-2:] == ["consolidate", "semantic_update"]
    assert set(actions[2:-2]) == {"read"}
    assert {e.seq for e in new} == set(range(before + 1, before + 1 + len(new)))
    assert all(e.outcome == "success" and e.actor == "msm-mem-agent" for e in new)
    (item,) = any_mem._store.stm_list()
    assert new[1].record_ids == (item.item_id,)
    episode = next(any_mem._store.iter_episodes())
    assert episode.episode_id in new[-2].record_ids


def test_events_hold_no_patient_identifier_or_narrative(any_mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """No payload holds the patient id, question, answer, decision or correction; the pseudonym appears."""
    _busy(any_mem, tmp_path, clock)
    payloads = [r.payload for r in any_mem._store.iter_audit()]
    blob = b"\n".join(payloads)
    pseudonym = any_mem._audit.pseudonym(PATIENT)
    assert pseudonym.startswith("pt-") and pseudonym.encode() in blob
    for secret in (
        PATIENT,
        "998877",
        QUESTION,
        "zebra",
        ANSWER,
        "zebrastripe",
        CORRECTION,
        "quokka",
        "follow up",
        "ACC-1",
        "ACC-3",
    ):
        assert secret.encode() not in blob, secret
    actions = {e.action for e in audit_events(any_mem._store)}
    assert {"consent", "write", "read", "consolidate", "hold", "semantic_update", "critic_reject", "decay"} <= actions


def test_pseudonym_is_random_and_stable(any_mem: MsmMem, tmp_path: Path) -> None:
    """A patient's pseudonym is random, the same after reopening, and differs between patients."""
    first = any_mem._audit.pseudonym(PATIENT)
    assert first == any_mem._audit.pseudonym(PATIENT) != any_mem._audit.pseudonym("OTHER")
    assert PATIENT not in first and "998877" not in first
    any_mem.close()
    with MsmMem.open(tmp_path / "s") as again:
        assert again._audit.pseudonym(PATIENT) == first


# tamper evidence ------------------------------------------------------------------------------


def _db(mem_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(mem_dir / "msm-mem.sqlite", isolation_level=None)


#: a direct connection to the store of record: sqlite3 (the command-line tests) or RawDb (either backend)
Db = sqlite3.Connection | RawDb


def _shift(con: Db, from_seq: int, by: int = 1) -> None:
    """Renumber rows with seq >= from_seq by +by (through negative seqs to dodge the primary key)."""
    con.execute("UPDATE audit SET seq = -(seq + ?) WHERE seq >= ?", (by, from_seq))
    con.execute("UPDATE audit SET seq = -seq WHERE seq < 0")


def _row(con: Db, seq: int) -> tuple[bytes, str]:
    payload, digest = con.execute("SELECT payload, event_hash FROM audit WHERE seq = ?", (seq,)).fetchone()
    return bytes(payload), str(digest)


def _flip(con: Db, k: int) -> None:
    payload, _ = _row(con, k)
    data = bytearray(payload)
    data[len(data) // 2] ^= 0x01
    con.execute("UPDATE audit SET payload = ? WHERE seq = ?", (bytes(data), k))


def _delete(con: Db, k: int) -> None:
    con.execute("DELETE FROM audit WHERE seq = ?", (k,))


def _insert_garbage(con: Db, k: int) -> None:
    payload, digest = _row(con, 1)
    _shift(con, k)
    con.execute("INSERT INTO audit VALUES (?, ?, ?, 'default')", (k, payload, digest))


def _swap(con: Db, k: int) -> None:
    a, b = _row(con, k), _row(con, k + 1)
    con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (*b, k))
    con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (*a, k + 1))


def _duplicate(con: Db, k: int) -> None:
    row = _row(con, k)
    _shift(con, k + 1)
    con.execute("INSERT INTO audit VALUES (?, ?, ?, 'default')", (k + 1, *row))


def _gap(con: Db, k: int) -> None:
    _shift(con, k)


#: tampering -> the first bad seq the verifier must name when event k is attacked
TAMPER: dict[str, tuple[Callable[[Db, int], None], int]] = {
    "bit_flip": (_flip, 0),
    "deleted": (_delete, 0),
    "inserted": (_insert_garbage, 0),
    "swapped": (_swap, 0),
    "duplicated": (_duplicate, 1),
    "seq_gap": (_gap, 0),
}


def _store_with_events(tmp_path: Path, new_mem: MemFactory | None = None) -> tuple[Path, int]:
    """A closed store with three answered turns (SQLite, or of the backend of ``new_mem``); its head seq."""
    directory = tmp_path / "s"
    options = {"clock": FixedClock(T0), "backbone": FixedBackbone(ANSWER, "follow up in 3 months")}
    mem = MsmMem.init(directory, ADMIN, **options) if new_mem is None else new_mem("s", **options)
    for seed in (1, 2, 3):
        mem.ask(AGENT, PATIENT, _png(tmp_path, seed), QUESTION, study_id=f"ACC-{seed}")
    head = mem._store.audit_head()[0]
    mem.close()
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
    con = _db(directory)
    tamper(con, k)
    con.close()
    code, out = _verify_cli(directory, capsys)
    assert code != 0
    assert f"first bad seq {k + offset}:" in out
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem._audit.verify(full=full)
            assert not result.ok and result.first_bad_seq == k + offset


def test_forged_insert_with_valid_links_names_the_next_slot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An inserted event forged with a valid hash and link to its predecessor is caught at the slot after it."""
    directory, head = _store_with_events(tmp_path)
    k = head // 2
    con = _db(directory)
    prev_payload, prev_hash = _row(con, k - 1)
    forged = ChainBuilder(k - 1, prev_hash).next(
        time=T0,
        actor="mallory",
        role="admin",
        action="read",
        source_tier="ltm",
        target_tier="stm",
        purpose="treatment",
        outcome="success",
    )
    _shift(con, k)
    con.execute("INSERT INTO audit VALUES (?, ?, ?, 'default')", forged.row())
    con.close()
    code, out = _verify_cli(directory, capsys)
    assert code != 0 and f"first bad seq {k + 1}:" in out


def test_truncated_tail_after_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deleting the last events after a checkpoint names the first missing seq."""
    directory, head = _store_with_events(tmp_path)
    assert main(["audit", "checkpoint", str(directory), *AUDITOR_FLAGS]) == 0
    con = _db(directory)
    con.execute("DELETE FROM audit WHERE seq > ?", (head - 3,))
    con.close()
    capsys.readouterr()
    code, out = _verify_cli(directory, capsys)
    assert code != 0 and f"first bad seq {head - 2}:" in out and "truncated" in out


def test_recomputed_chain_after_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Events rewritten with valid hashes pass the chain check but not the signed checkpoint."""
    directory, head = _store_with_events(tmp_path)
    with MsmMem.open(directory, clock=FixedClock(T0)) as mem:
        mem._audit.checkpoint()
    con = _db(directory)
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
        chain_only = mem._audit.verify()
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
            result = mem._audit.verify(full=full)
            assert (result.ok, result.first_bad_seq) == (False, k + offset), (full, result)


def test_verify_api_catches_a_forged_insert_at_the_next_slot(tmp_path: Path, new_mem: MemFactory) -> None:
    """An inserted event forged with a valid hash and link to its predecessor is caught at the slot after it."""
    directory, head = _store_with_events(tmp_path, new_mem)
    k = head // 2
    with raw_db(directory) as con:
        _, prev_hash = _row(con, k - 1)
        forged = ChainBuilder(k - 1, prev_hash).next(
            time=T0,
            actor="mallory",
            role="admin",
            action="read",
            source_tier="ltm",
            target_tier="stm",
            purpose="treatment",
            outcome="success",
        )
        _shift(con, k)
        con.execute("INSERT INTO audit VALUES (?, ?, ?, 'default')", forged.row())
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem._audit.verify(full=full)
            assert (result.ok, result.first_bad_seq) == (False, k + 1), (full, result)


def test_verify_api_names_a_truncated_tail_after_checkpoint(tmp_path: Path, new_mem: MemFactory) -> None:
    """Deleting the last events after a checkpoint names the first missing seq."""
    directory, head = _store_with_events(tmp_path, new_mem)
    with MsmMem.open(directory, clock=FixedClock(T0)) as mem:
        mem._audit.checkpoint()
    with raw_db(directory) as con:
        con.execute("DELETE FROM audit WHERE seq > ?", (head - 3,))
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem._audit.verify(full=full)
            assert (result.ok, result.first_bad_seq) == (False, head - 2), (full, result)
            assert "truncated" in result.reason


def test_verify_api_catches_a_recomputed_chain_by_its_checkpoint(tmp_path: Path, new_mem: MemFactory) -> None:
    """Events rewritten with valid hashes and links pass the chain walk but not the signed checkpoint."""
    directory, head = _store_with_events(tmp_path, new_mem)
    with MsmMem.open(directory, clock=FixedClock(T0)) as mem:
        mem._audit.checkpoint()
    with raw_db(directory) as con:
        _recompute(con, head // 2)
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem._audit.verify(full=full)
            assert (result.ok, result.first_bad_seq) == (False, _first_unproven(directory, head // 2)), (full, result)
            assert "edited and rehashed" in result.reason


def test_open_handle_continues_after_another_handle_appends(mem: MsmMem, tmp_path: Path) -> None:
    """Events appended through another handle (the CLI) do not break the next turn of an open handle."""
    mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    assert main(["audit", "checkpoint", str(mem.directory), *AUDITOR_FLAGS]) == 0
    assert (
        main(
            [
                "consent",
                "grant",
                str(mem.directory),
                "--patient",
                "*",
                "--grantee",
                "role:auditor",
                "--purpose",
                "treatment",
                *ADMIN_FLAGS,
            ]
        )
        == 0
    )
    head = mem._store.audit_head()[0]
    mem.ask(AGENT, PATIENT, _png(tmp_path, 2), QUESTION)  # would fail if the handle chained after a stale head
    new = audit_events(mem._store)[head:]
    assert new[0].seq == head + 1 and new[-1].action == "semantic_update"
    assert all(e.outcome == "success" for e in new)
    assert mem._audit.verify().ok


def test_appends_continue_after_verify_and_checkpoint(any_mem: MsmMem, tmp_path: Path) -> None:
    """A checkpointed chain keeps growing and still verifies, fully and by hashes only."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    size, head = any_mem._audit.checkpoint()
    assert (size, head) == any_mem._store.audit_head()
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 2), QUESTION)
    assert any_mem._audit.verify().ok and any_mem._audit.verify(full=False).ok
    assert any_mem._audit.verify().count == any_mem._store.audit_head()[0]


# retention --------------------------------------------------------------------------------------


def test_purge_refused_within_six_years(any_mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Events younger than 6 years cannot be purged; nothing is deleted."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    head = any_mem._store.audit_head()[0]
    clock.advance(RETENTION_S - 1)
    with pytest.raises(AccessDenied, match="retention"):
        any_mem._audit.purge(head, actor="root", role="admin", reason="retention expired")
    assert any_mem._store.audit_head()[0] == head and any_mem._store.audit_base()[0] == 0
    assert RETENTION_S >= 6 * 365 * 86400


def test_purge_after_retention_keeps_the_chain_verifiable(any_mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """Past 6 years old events go; verify still passes and new events continue the chain."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    any_mem._audit.checkpoint()
    old_head = any_mem._store.audit_head()
    clock.advance(RETENTION_S + 86400)
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 2), QUESTION)  # young events stay
    with pytest.raises(AccessDenied):
        any_mem._audit.purge(any_mem._store.audit_head()[0], actor="root", role="admin", reason="retention expired")
    assert any_mem._audit.purge(old_head[0], actor="root", role="admin", reason="retention expired") == old_head[0]
    assert any_mem._store.audit_base() == old_head
    assert [r.seq for r in any_mem._store.iter_audit()][0] == old_head[0] + 1
    assert any_mem._audit.verify().ok
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 3), QUESTION)
    any_mem._audit.checkpoint()
    assert any_mem._audit.verify().ok and any_mem._audit.verify(full=False).ok
    clock.advance(RETENTION_S + 86400)
    with pytest.raises(NotFound):
        any_mem._audit.purge(10**6, actor="root", role="admin", reason="retention expired")


def test_purge_is_itself_audited(any_mem: MsmMem, tmp_path: Path, clock: FixedClock) -> None:
    """A purge leaves an event naming who purged and why."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    head = any_mem._store.audit_head()[0]
    clock.advance(RETENTION_S + 86400)
    with pytest.raises(IllegalTransition):
        any_mem._audit.purge(head, actor="agent-1", role="agent", reason="retention expired")
    with pytest.raises(IllegalTransition):
        any_mem._audit.purge(head, actor="root", role="admin", reason=" ")
    any_mem._audit.purge(head, actor="root", role="admin", reason="retention expired")
    (event,) = audit_events(any_mem._store)
    assert (event.action, event.actor, event.role, event.reason) == (
        "purge_expired",
        "root",
        "admin",
        "retention expired",
    )
    assert any_mem._audit.verify().ok


def test_a_spec_is_a_typed_event_with_the_pinned_bytes(any_mem: MsmMem, clock: FixedClock) -> None:
    """spec() gives a frozen AuditSpec that, once written, is stored as the pinned vector's bytes."""
    fields, payload, digest = VECTORS[1]
    clock.advance(fields["time"] - clock.now())
    spec = any_mem._audit.spec(**{k: v for k, v in fields.items() if k != "time"})
    assert isinstance(spec, AuditSpec) and spec.time == fields["time"] and spec.record_ids == ()
    assert ChainBuilder(1, VECTORS[0][2]).next_row_of(spec) == (2, payload, digest)
    before = any_mem._store.audit_head()[0]
    any_mem._audit.write(WriteBatch(), [spec])
    stored = audit_events(any_mem._store)[before]
    assert (stored.action, stored.reason, stored.outcome) == ("purge_expired", fields["reason"], "denied")
    assert any_mem._audit.verify().ok


# verification across the pages a store hands over -------------------------------------------

PAGE = AUDIT_PAGE_ROWS


@pytest.fixture(scope="module")
def paged(
    tmp_path_factory: pytest.TempPathFactory, module_backend: str, init_options: Callable[..., dict[str, Any]]
) -> Path:
    """A store of PAGE + 50 events, checkpointed at the last row of the first page, the first
    row of the second page and the head (one per backend)."""
    directory = tmp_path_factory.mktemp("paged") / "s"
    with MsmMem.init(directory, ADMIN, **init_options(module_backend, clock=FixedClock(T0))) as mem:
        mem._audit.checkpoint_every = 10**9
        for size in (PAGE, PAGE + 1, PAGE + 50):
            specs = [
                mem._audit.spec(
                    actor="rad-1",
                    role="clinician",
                    action="read",
                    source_tier="ltm",
                    target_tier="stm",
                    purpose="treatment",
                    record_ids=[f"E-{i}"],
                )
                for i in range(size - mem._store.audit_head()[0])
            ]
            mem._audit.write(WriteBatch(), specs)
            assert mem._audit.checkpoint()[0] == size
    return directory


def _copy(directory: Path, tmp_path: Path) -> Path:
    return copy_store(directory, tmp_path / "copy")


def _relink(con: Db, k: int) -> None:
    """Point event k's prev_hash elsewhere and store the matching event_hash."""
    payload, _ = _row(con, k)
    at = payload.index(b'"prev_hash":"') + 13
    forged = payload[:at] + b"f" * 64 + payload[at + 64 :]
    con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (forged, sha256(forged).hexdigest(), k))


def _recompute(con: Db, k: int) -> None:
    """Rewrite events k.. with valid hashes and links (caught only by the checkpoints)."""
    builder = ChainBuilder(k - 1, _row(con, k - 1)[1])
    for (seq,) in con.execute("SELECT seq FROM audit WHERE seq >= ? ORDER BY seq", (k,)).fetchall():
        rewritten = builder.next(
            time=T0,
            actor="mallory",
            role="admin",
            action="read",
            source_tier="ltm",
            target_tier="stm",
            purpose="treatment",
            outcome="success",
        )
        con.execute(
            "UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?",
            (rewritten.payload(), rewritten.event_hash, seq),
        )


#: tampering at the page boundary -> (event attacked, first bad seq)
PAGE_TAMPER: dict[str, tuple[Callable[[Db, int], object], int, int]] = {
    "bit_flip": (_flip, PAGE + 1, PAGE + 1),
    "prev_hash": (_relink, PAGE + 1, PAGE + 1),
    "deleted": (_delete, PAGE, PAGE),
    "swapped": (_swap, PAGE, PAGE),
    "truncated": (lambda con, k: con.execute("DELETE FROM audit WHERE seq >= ?", (k,)), PAGE + 21, PAGE + 21),
    "recomputed": (_recompute, PAGE + 1, PAGE + 1),
}


def test_verify_walks_pages_and_reads_checkpoints_on_both_sides(paged: Path, tmp_path: Path) -> None:
    """A chain longer than a page verifies in both modes, checkpoints at either side of the boundary included."""
    with MsmMem.open(_copy(paged, tmp_path)) as mem:
        head = mem._store.audit_head()
        assert head[0] == PAGE + 50
        for full in (True, False):
            assert mem._audit.verify(full=full) == VerifyResult(True, *head, None, "")


@pytest.mark.parametrize("name", sorted(PAGE_TAMPER))
def test_tampering_at_a_page_boundary_names_first_bad_seq(paged: Path, tmp_path: Path, name: str) -> None:
    """Edits next to the page boundary are found by both modes, naming the same first bad seq."""
    directory = _copy(paged, tmp_path)
    tamper, k, bad = PAGE_TAMPER[name]
    con = raw_db(directory)
    tamper(con, k)
    con.close()
    with MsmMem.open(directory) as mem:
        for full in (True, False):
            result = mem._audit.verify(full=full)
            assert (result.ok, result.first_bad_seq) == (False, bad), (full, result)
