"""A PostgreSQL store of several patient lanes (``init(audit_chains=N)``): a chain, a lock and
row digests per lane; writers of different lanes in parallel; every chain verified, and any
chain's truncation, rewrite or row change detected (a real server the tests start)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from msm_mem import InvalidInput, StoreError
from msm_mem._api.mem import MsmMem
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.checkpoint import Checkpoint
from msm_mem._governance.audit.event import AuditEvent, AuditSpec
from msm_mem._governance.audit.fhir import verify_fhir
from msm_mem._storage.base import AuditChainer
from msm_mem._storage.batch import WriteBatch
from msm_mem._storage.lanes import lane_of
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.helpers import ADMIN, AGENT, audit_fields, png
from tests.layers import Layers, open_layers

pytestmark = pytest.mark.postgres

ANSWER = "Right lower lobe consolidation, new since prior"
LANES = 4


def _patients(n: int) -> list[str]:
    """One patient of each of the ``n`` lanes."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        found.setdefault(lane_of(f"P{i}", n), f"P{i}")
        i += 1
    return [found[lane] for lane in range(n)]


@pytest.fixture
def laned(tmp_path: Path, postgres_url: str, pg_schema: str) -> Path:
    """A store of four lanes with one study of a patient of each lane written back."""
    directory = tmp_path / "m"
    with MsmMem.init(
        directory,
        ADMIN,
        database_url=postgres_url,
        schema=pg_schema,
        clock=FixedClock(1.7e9),
        backbone=FixedBackbone(ANSWER, "treat"),
        audit_chains=LANES,
    ) as mem:
        for i, patient in enumerate(_patients(LANES)):
            reply = mem.ask(AGENT, patient, png(tmp_path, i), "What is the impression?", study_id="S1")
            assert reply.gate is not None and reply.gate.written
    return directory


def _open(directory: Path) -> MsmMem:
    return MsmMem.open(directory, clock=FixedClock(1.7e9 + 60), backbone=FixedBackbone(ANSWER, "treat"))


def test_every_lane_has_its_chain_and_the_store_verifies(laned: Path, postgres_url: str, pg_schema: str) -> None:
    """Each lane's events take seqs of its residue modulo 4, close above the seqs before them;
    the whole store verifies, fully and by hashes."""
    with _open(laned) as mem:
        assert mem.verify_audit(ADMIN).ok and mem.verify_audit(ADMIN, full=False).ok
    with psycopg.connect(postgres_url) as conn:
        seqs = [r[0] for r in conn.execute(sql.SQL("SELECT seq FROM {}.audit").format(sql.Identifier(pg_schema)))]
    assert {seq % LANES for seq in seqs} == set(range(LANES)) and len(set(seqs)) == len(seqs)
    # each write took the first seq of its chain above every stored one: gaps of under 4 a write
    assert max(seqs) < LANES * len(seqs)


def _read_spec(layers: Layers, patient: str) -> AuditSpec:
    return layers.audit.spec(
        actor="rad-1",
        role="clinician",
        action="read",
        source_tier="ltm",
        target_tier="stm",
        purpose="treatment",
        record_ids=["E-1"],
        patient=patient,
    )


def _holding(
    layers: Layers, batch: WriteBatch, specs: list[AuditSpec], entered: threading.Event, release: threading.Event
) -> threading.Thread:
    """A started thread writing ``batch`` with ``specs`` through ``layers`` that, once signed,
    sets ``entered`` and keeps its transaction open until ``release`` (at most 30 s)."""

    def apply(chain: AuditChainer, sign: Callable[[], None]) -> None:
        def before() -> None:
            sign()
            entered.set()
            release.wait(30)

        layers.handle.write(batch, chain, before_commit=before)

    thread = threading.Thread(target=lambda: layers.audit.commit(apply, specs))
    thread.start()
    return thread


def test_a_writer_of_another_lane_goes_on_while_one_holds_its_lane(laned: Path) -> None:
    """While a write of a lane-0 patient holds its transaction open, a write of a lane-1 patient
    (another handle) commits, and a second write of lane 0 waits for the first to commit."""
    first_lane, other_lane = _patients(LANES)[0], _patients(LANES)[1]
    same_lane = next(f"Q{i}" for i in range(1000) if lane_of(f"Q{i}", LANES) == 0)
    entered, release, done = threading.Event(), threading.Event(), threading.Event()
    with open_layers(laned) as one, open_layers(laned) as two, open_layers(laned) as three:
        holder = _holding(one, WriteBatch(patients=[first_lane]), [_read_spec(one, first_lane)], entered, release)
        assert entered.wait(30)
        other = threading.Thread(target=lambda: two.audit.write(WriteBatch(), [_read_spec(two, other_lane)]))
        other.start()
        other.join(10)
        assert not other.is_alive()  # lane 1 is free: it committed while lane 0 is held

        def queued() -> None:
            three.audit.write(WriteBatch(), [_read_spec(three, same_lane)])
            done.set()

        waiter = threading.Thread(target=queued)
        waiter.start()
        assert not done.wait(1.0)  # lane 0 is held
        release.set()
        holder.join(30)
        waiter.join(30)
        assert done.is_set()
    with _open(laned) as mem:
        assert mem.verify_audit(ADMIN).ok


def _sql(url: str, schema: str, statement: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        cur = conn.execute(sql.SQL(statement).format(schema=sql.Identifier(schema)), args)
        return cur.fetchall() if cur.description else []


def test_truncating_one_chain_is_detected(laned: Path, postgres_url: str, pg_schema: str) -> None:
    """Deleting the last event of one chain fails verification, naming that chain and its first missing seq."""
    with _open(laned) as mem:
        assert mem.verify_audit(ADMIN).ok
    (last,) = _sql(postgres_url, pg_schema, "SELECT max(seq) FROM {schema}.audit WHERE MOD(seq, 4) = 2")[0]
    _sql(postgres_url, pg_schema, "DELETE FROM {schema}.audit WHERE seq = %s", last)
    with _open(laned) as mem:
        result = mem.verify_audit(ADMIN)
    assert not result.ok and "chain 2" in result.reason and result.first_bad_seq == last


def test_a_rewritten_event_of_one_chain_is_detected(laned: Path, postgres_url: str, pg_schema: str) -> None:
    """An event edited in one chain (its hash recomputed) fails verification at that seq."""
    (seq, payload) = _sql(
        postgres_url, pg_schema, "SELECT seq, payload FROM {schema}.audit WHERE MOD(seq, 4) = 3 ORDER BY seq LIMIT 1"
    )[0]
    forged = bytes(payload).replace(b'"success"', b'"failure"', 1)  # type: ignore[arg-type]
    assert forged != bytes(payload)  # type: ignore[arg-type]
    _sql(
        postgres_url,
        pg_schema,
        "UPDATE {schema}.audit SET payload = %s, event_hash = encode(sha256(%s), 'hex') WHERE seq = %s",
        forged,
        forged,
        seq,
    )
    with _open(laned) as mem:
        result = mem.verify_audit(ADMIN)
    assert not result.ok and "chain 3" in result.reason


def test_a_row_changed_in_one_lane_is_detected(laned: Path, postgres_url: str, pg_schema: str) -> None:
    """A governed row's state changed in the database fails full verification, naming its lane."""
    patient = _patients(LANES)[1]
    _sql(postgres_url, pg_schema, "UPDATE {schema}.episodic SET confidence = 0.01 WHERE patient_id = %s", patient)
    with _open(laned) as mem:
        assert mem.verify_audit(ADMIN, full=False).ok
        result = mem.verify_audit(ADMIN)
    assert not result.ok and "lane 1" in result.reason and "episodic" in result.reason


def _drop_checkpoints_of(directory: Path, chain: int) -> None:
    """The insider's cut: every checkpoint line of ``chain`` and its signed head file removed."""
    log = directory / "audit" / "checkpoints.jsonl"
    keep = [line for line in log.read_bytes().splitlines() if Checkpoint.from_json(line).chain != chain]
    log.write_bytes(b"".join(line + b"\n" for line in keep))
    (directory / "audit" / f"checkpoints.{chain}.head").unlink()


def test_a_missing_head_file_of_one_chain_with_its_lines_gone_is_detected(laned: Path) -> None:
    """The signed head of chain 2 deleted with its log lines leaves chain 2's events uncovered."""
    _drop_checkpoints_of(laned, 2)
    with _open(laned) as mem:
        result = mem.verify_audit(ADMIN)
    assert not result.ok and "chain 2" in result.reason


def test_an_embedded_store_has_one_chain(tmp_path: Path) -> None:
    """audit_chains above 1 without a database is refused, and nothing is made."""
    with pytest.raises(InvalidInput, match="one audit chain"):
        MsmMem.init(tmp_path / "m", ADMIN, audit_chains=4)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("chains", [0, 257, "4"])
def test_a_bad_number_of_chains_is_refused(tmp_path: Path, postgres_url: str, pg_schema: str, chains: object) -> None:
    """audit_chains outside 1..256 (or not an integer) is refused before anything is made."""
    with pytest.raises(InvalidInput, match="audit chains"):
        MsmMem.init(tmp_path / "m", ADMIN, database_url=postgres_url, schema=pg_schema, audit_chains=chains)  # type: ignore[arg-type]


def test_a_purge_of_a_store_of_chains_is_refused_and_deletes_nothing(
    laned: Path, postgres_url: str, pg_schema: str
) -> None:
    """A retention purge of a store of several chains is refused with a reason; every event stays."""
    before = _sql(postgres_url, pg_schema, "SELECT count(*) FROM {schema}.audit")[0][0]
    with open_layers(laned) as layers, pytest.raises(StoreError, match="several"):
        layers.handle.audit_purge(LANES + 1)
    assert _sql(postgres_url, pg_schema, "SELECT count(*) FROM {schema}.audit")[0][0] == before


def test_an_event_appended_to_one_chain_outside_msm_mem_is_detected(
    laned: Path, postgres_url: str, pg_schema: str
) -> None:
    """An event appended to chain 1 with a valid hash and link but no checkpoint is named as
    covered by no signed checkpoint."""
    seq, payload = _sql(
        postgres_url,
        pg_schema,
        "SELECT seq, payload FROM {schema}.audit WHERE MOD(seq, 4) = 1 ORDER BY seq DESC LIMIT 1",
    )[0]
    event = AuditEvent.from_row(int(seq), bytes(payload), hashlib.sha256(bytes(payload)).hexdigest())  # type: ignore[arg-type]
    top = _sql(postgres_url, pg_schema, "SELECT max(seq) FROM {schema}.audit")[0][0]
    builder = ChainBuilder(event.seq, event.event_hash, LANES, int(top))  # type: ignore[arg-type]
    new_seq, new_payload, digest = builder.next_row(**audit_fields(0, time=event.time, actor="mallory"))
    tenant = _sql(postgres_url, pg_schema, "SELECT tenant FROM {schema}.audit LIMIT 1")[0][0]
    _sql(
        postgres_url,
        pg_schema,
        "INSERT INTO {schema}.audit (seq, payload, event_hash, tenant) VALUES (%s, %s, %s, %s)",
        new_seq,
        new_payload,
        digest,
        tenant,
    )
    with _open(laned) as mem:
        for full in (True, False):
            result = mem.verify_audit(ADMIN, full=full)
            assert not result.ok and result.first_bad_seq == new_seq
            assert "chain 1" in result.reason and "covered by no signed checkpoint" in result.reason


def test_the_checkpoint_log_deleted_is_detected(laned: Path) -> None:
    """A store of chains whose checkpoint log is gone does not verify and names the file."""
    (laned / "audit" / "checkpoints.jsonl").unlink()
    with _open(laned) as mem:
        result = mem.verify_audit(ADMIN)
    assert not result.ok and "checkpoints.jsonl is missing" in result.reason


def test_a_chain_cut_with_its_log_lines_and_head_file_is_caught_by_the_root(
    laned: Path, postgres_url: str, pg_schema: str
) -> None:
    """Chain 3's last event deleted with every checkpoint of chain 3 and its head file: another
    chain's checkpoint signed chain 3's head in its root, so the cut is found."""
    with _open(laned) as mem:  # a commit on chain 0 after chain 3's last: its root holds chain 3's head
        mem.consents(ADMIN)
        mem.ask(AGENT, _patients(LANES)[0], png(laned.parent, 9), "Any change?", study_id="S2")
    (last,) = _sql(postgres_url, pg_schema, "SELECT max(seq) FROM {schema}.audit WHERE MOD(seq, 4) = 3")[0]
    _sql(postgres_url, pg_schema, "DELETE FROM {schema}.audit WHERE seq = %s", last)
    _drop_checkpoints_of(laned, 3)
    with _open(laned) as mem:
        result = mem.verify_audit(ADMIN)
    assert not result.ok and "chain 3" in result.reason and "tail truncated" in result.reason
    assert result.first_bad_seq is not None and result.first_bad_seq % LANES == 3


def test_the_fhir_export_of_a_store_of_chains_verifies_chain_by_chain(laned: Path, tmp_path: Path) -> None:
    """The export holds every event in seq order and verifies with the store's chains; an edited
    line fails, naming its seq."""
    out = tmp_path / "audit.ndjson"
    with _open(laned) as mem:
        count = mem.export_fhir(ADMIN, out)
        total = mem.verify_audit(ADMIN).count
    assert count >= total - 1  # the export's own event comes after it
    result = verify_fhir(out, chains=LANES)
    assert result.ok and result.count == count
    lines = out.read_bytes().splitlines()
    assert len(lines) == count and all(json.loads(line)["resourceType"] == "AuditEvent" for line in lines)
    edited = lines[2].replace(b'"id":"audit-', b'"id":"audit-9', 1)  # a readable field, not the hashed payload
    assert edited != lines[2]
    out.write_bytes(b"".join(line + b"\n" for line in [*lines[:2], edited, *lines[3:]]))
    bad = verify_fhir(out, chains=LANES)
    assert not bad.ok and bad.first_bad_seq is not None


def test_a_write_of_patients_of_two_lanes_locks_both_and_joins_the_lower_chain(laned: Path) -> None:
    """A batch naming patients of lanes 1 and 3 appends its event to chain 1 and keeps writers
    of lane 3 waiting until it commits."""
    one, three = _patients(LANES)[1], _patients(LANES)[3]
    entered, release = threading.Event(), threading.Event()
    with open_layers(laned) as first, open_layers(laned) as second:
        batch = WriteBatch(patients=[one, three])
        holder = _holding(first, batch, [_read_spec(first, one), _read_spec(first, three)], entered, release)
        assert entered.wait(30)
        waiting = threading.Thread(target=lambda: second.audit.write(WriteBatch(), [_read_spec(second, three)]))
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive()  # lane 3 is held by the two-lane write
        release.set()
        holder.join(30)
        waiting.join(30)
        assert not waiting.is_alive()
    assert len(batch.audit) == 2 and all(row.seq % LANES == 1 for row in batch.audit)
    with _open(laned) as mem:
        assert mem.verify_audit(ADMIN).ok


def test_records_of_several_lanes_iterate_in_the_order_written(laned: Path) -> None:
    """Vector positions take the first value of the lane's residue above every stored one, so
    records written one after another, in any lanes, iterate in that order."""
    patients = _patients(LANES)
    with _open(laned) as mem:
        for i, patient in enumerate([patients[3], patients[0], patients[2], patients[1]]):
            mem.ask(AGENT, patient, png(laned.parent, 20 + i), "Any change?", study_id=f"S{i + 2}")
    with open_layers(laned) as layers:
        studies = [e.study_id for e in layers.store.iter_episodes()]
    assert studies[-4:] == ["S2", "S3", "S4", "S5"]


def test_init_from_the_cli_makes_a_store_of_chains(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    """msm-mem init --audit-chains 8 makes a store of 8 chains; without --database-url it is refused."""
    directory = tmp_path / "c"
    code = main(["init", str(directory), "--database-url", postgres_url, "--schema", pg_schema, "--audit-chains", "8"])
    assert code == 0
    with open_layers(directory) as layers:
        assert layers.store.audit_chains() == 8 and layers.audit.chains == 8
    assert main(["init", str(tmp_path / "d"), "--audit-chains", "8"]) != 0
    assert not (tmp_path / "d").exists()


def test_the_trail_tail_is_the_last_events_of_every_chain(laned: Path) -> None:
    """The audit trail's tail of a store of chains holds the last ``limit`` events by seq, every
    chain's among them, and its head is the store's last seq."""
    with _open(laned) as mem:
        last = mem.audit_trail(ADMIN, limit=6, tail=True)
        everything = mem.audit_trail(ADMIN, limit=5000)  # also the event of the read above
    seqs = [e.seq for e in everything.events if e.seq <= last.head_seq]
    assert seqs == sorted(seqs) and len({s % LANES for s in seqs}) == LANES
    assert [e.seq for e in last.events] == seqs[-6:] and last.head_seq == seqs[-1]


def test_a_patients_lane_is_fixed_and_patients_spread_over_the_lanes() -> None:
    """lane_of is the documented hash (pinned: a stored store's lanes must never move), 0 for a
    store of one lane, and spreads 4,000 ids over 8 lanes within 20% of even."""
    expected = int.from_bytes(hashlib.sha256(b"msm-mem lane\x00P-17").digest()[:8], "big") % 8
    assert lane_of("P-17", 8) == expected and lane_of("P-17", 1) == 0
    counts = [0] * 8
    for i in range(4000):
        counts[lane_of(f"patient-{i}", 8)] += 1
    assert min(counts) > 400 and max(counts) < 600
