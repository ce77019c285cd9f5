"""The governed tiers' part of the store contract, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from msm_mem import IllegalTransition, InvalidInput, NotFound, SemanticState, State, StmPayload
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS
from msm_mem._governance.audit.verify import verify_hashes_in_batches, verify_hashes_only
from msm_mem._storage.base import AUDIT_PAGE_ROWS, StateChange, Store, WriteBatch
from msm_mem._tier_records import (
    AuditRow,
    Claim,
    ConsentRecord,
    Entity,
    Relationship,
    StmChange,
    StmItem,
    StmState,
    WrappedKey,
)
from tests.conftest import random_unit

pytestmark = pytest.mark.cluster


def item(i: int, patient: str = "p", created: float = 100.0) -> StmItem:
    return StmItem(
        f"M-{i}",
        patient,
        "interaction",
        StmPayload("q", 100.0),
        created,
        created + 50,
        z=random_unit(np.random.default_rng(i)),
    )


def claim(cid: str, key: str = "study:1", supersedes: str | None = None, decay: float | None = None) -> Claim:
    return Claim(cid, "p", key, "content", "source", 0.5, "agent", 1.0, decay, supersedes=supersedes)


def rows(n: int) -> list[AuditRow]:
    b = ChainBuilder()
    return [
        AuditRow(
            *b.next(
                time=1.0,
                actor="a",
                role="agent",
                action="read",
                source_tier="ltm",
                target_tier="stm",
                purpose="treatment",
                outcome="success",
            ).row()
        )
        for _ in range(n)
    ]


def test_stm_items_round_trip_and_filter(store: Store) -> None:
    """STM items come back whole; filters by patient, state, expiry and age select them."""
    store.write(WriteBatch(stm=[item(1), item(2, "q", created=200.0)]))
    got = store.stm_get(["M-1"])[0]
    assert got.payload == StmPayload("q", 100.0) and np.array_equal(got.z, item(1).z)
    assert [i.item_id for i in store.stm_list(patient_id="q")] == ["M-2"]
    assert [i.item_id for i in store.stm_list(expires_before=160.0)] == ["M-1"]
    assert [i.item_id for i in store.stm_list(created_before=150.0, state=StmState.ACTIVE)] == ["M-1"]
    with pytest.raises(NotFound):
        store.stm_get(["M-9"])


def test_stm_changes_check_the_expected_state(store: Store) -> None:
    """A change applies only from the expected state; purge forgets payload and embedding."""
    store.write(WriteBatch(stm=[item(1)]))
    store.write(WriteBatch(stm_changes=[StmChange("M-1", StmState.ACTIVE, StmState.EXPIRED, purge=True)]))
    expired = store.stm_get(["M-1"])[0]
    assert expired.state == StmState.EXPIRED and expired.payload is None and expired.z is None
    with pytest.raises(IllegalTransition):
        store.write(WriteBatch(stm_changes=[StmChange("M-1", StmState.ACTIVE, StmState.CONSOLIDATED)]))
    with pytest.raises(NotFound):
        store.write(WriteBatch(stm_changes=[StmChange("M-2", StmState.ACTIVE, StmState.CONSOLIDATED)]))


def test_an_item_born_and_changed_in_one_batch(store: Store) -> None:
    """Inserting and consolidating in the same batch stores the final state."""
    store.write(WriteBatch(stm=[item(3)], stm_changes=[StmChange("M-3", StmState.ACTIVE, StmState.CONSOLIDATED)]))
    assert store.stm_get(["M-3"])[0].state == StmState.CONSOLIDATED


def test_claims_supersede_and_keep_one_active(store: Store) -> None:
    """A claim version supersedes the active one; a second active version is refused."""
    store.write(WriteBatch(claims=[claim("C-1")]))
    store.write(WriteBatch(claims=[claim("C-2", supersedes="C-1")]))
    assert [c.claim_id for c in store.claims_active("p")] == ["C-2"]
    assert [(c.claim_id, c.state) for c in store.claim_history("p", "study:1")] == [
        ("C-1", State.SUPERSEDED),
        ("C-2", State.ACTIVE),
    ]
    with pytest.raises(IllegalTransition):
        store.write(WriteBatch(claims=[claim("C-3")]))
    assert store.get_claims(["C-1", "C-2"])[1].claim_id == "C-2"


def test_decay_due_counts_from_the_patients_last_activity(store: Store) -> None:
    """Due: the patient's newest write + retention x confidence x weight has passed; the stored decay_at is ignored."""
    weights = {"agent": 0.5, "critic": 1.0}
    old = Claim("C-1", "p", "k1", "content", "source", 1.0, "agent", 1.0, 1e12)
    newest = Claim("C-2", "p", "k2", "content", "source", 1.0, "critic", 40.0, None)
    other = Claim("C-3", "q", "k1", "content", "source", 0.5, "made-up", 1.0, 0.0)
    store.write(WriteBatch(claims=[old, newest, other]))
    assert store.last_activity("p") == 40.0 and store.last_activity("nobody") is None
    # p: last 40; C-1 due 40 + 100 x 0.5 = 90, C-2 due 140; q: last 1, C-3 due 1 + 100 x 0.5 x 0.2 = 11
    assert store.decay_due(10.0, 100.0, weights, 0.2) == []
    assert [(d.record_id, d.last_activity) for d in store.decay_due(11.0, 100.0, weights, 0.2)] == [("C-3", 1.0)]
    due = store.decay_due(90.0, 100.0, weights, 0.2)
    assert [(d.table, d.record_id, d.state, d.confidence, d.evidence_tier) for d in due] == [
        ("claims", "C-1", State.ACTIVE, 1.0, "agent"),
        ("claims", "C-3", State.ACTIVE, 0.5, "made-up"),
    ]
    assert [d.record_id for d in store.decay_due(140.0, 100.0, weights, 0.2)] == ["C-1", "C-2", "C-3"]


def test_consents_are_stored_and_revoked(store: Store) -> None:
    """Consents for a patient include the every-patient ones; revocation sets revoked_at once."""
    mine = ConsentRecord("C-a", "p", "role:agent", "treatment", "permit", ("*",), 0.0)
    everyone = ConsentRecord("C-b", "*", "role:clinician", "treatment", "permit", ("*",), 0.0)
    other = ConsentRecord("C-c", "q", "role:agent", "treatment", "permit", ("*",), 0.0)
    store.write(WriteBatch(consents=[mine, everyone, other]))
    assert {c.consent_id for c in store.consents("p")} == {"C-a", "C-b"}
    store.write(WriteBatch(revocations=[("C-a", 7.0)]))
    assert next(c for c in store.consents("p") if c.consent_id == "C-a").revoked_at == 7.0
    with pytest.raises(NotFound):
        store.write(WriteBatch(revocations=[("C-a", 8.0)]))


def test_audit_rows_continue_the_chain(store: Store) -> None:
    """Audit rows must continue the stored head; they come back byte for byte."""
    assert store.audit_head() == (0, GENESIS)
    chain = rows(5)
    store.write(WriteBatch(audit=chain[:3]))
    with pytest.raises(InvalidInput):
        store.write(WriteBatch(audit=chain[4:]))
    store.write(WriteBatch(audit=chain[3:]))
    assert list(store.iter_audit()) == chain
    assert store.audit_head() == (5, chain[-1].event_hash)
    assert store.audit_purge(2) == 2
    assert store.audit_base() == (2, chain[1].event_hash) and [r.seq for r in store.iter_audit()] == [3, 4, 5]


def test_audit_batches_are_plain_rows_a_page_at_a_time(store: Store) -> None:
    """iter_audit_batches gives (int, bytes, str) rows in seq order, in non-empty pages, as iter_audit."""
    page = AUDIT_PAGE_ROWS
    chain = rows(2 * page + 1)
    store.write(WriteBatch(audit=chain))
    pages = list(store.iter_audit_batches())
    assert [len(p) for p in pages] == [page, page, 1]
    flat = [r for p in pages for r in p]
    assert flat == [tuple(r) for r in chain] == [tuple(r) for r in store.iter_audit()]
    assert {tuple(map(type, r)) for r in flat} == {(int, bytes, str)}
    assert [len(p) for p in store.iter_audit_batches(page + 2)] == [page]
    assert list(store.iter_audit_batches(2 * page + 2)) == []
    assert verify_hashes_in_batches(pages) == verify_hashes_only(chain)


def test_key_table_keeps_one_key_per_patient_and_shreds(store: Store) -> None:
    """Keys are stored per patient; shredding destroys the wrapped bytes and the pseudonym."""
    keys = store.keys()
    keys.put(WrappedKey("K-1", "p", "kek-1", b"wrapped", 1.0))
    keys.put_pseudonym("K-1", "pt-1", "token")
    assert keys.get("p").wrapped == b"wrapped" and keys.pseudonym("K-1") == ("pt-1", "token")
    keys.shred("p")
    assert keys.get("p").shredded and keys.get("p").wrapped == b"" and keys.pseudonym("K-1") is None
    assert keys.get_by_id("K-1").shredded


def test_key_made_by_a_batch_that_rolls_back_is_gone(store: Store) -> None:
    """A data key created while a batch is written (a new patient's first record) goes with
    the batch when it fails: no key is served for that patient afterwards, cached or not."""
    from msm_mem._governance.crypto import EnvelopeCipher
    from msm_mem._governance.envelope_codec import EnvelopeCodec
    from msm_mem.testing import InMemoryKeyProvider

    store.use_codec(EnvelopeCodec(EnvelopeCipher("tenant", InMemoryKeyProvider(), store.keys()), store.keys()))
    # the claim is encrypted (making the key) before the semantic state is refused
    orphan = SemanticState("S-2", "p", "impression", (), version=2, supersedes="S-none")
    with pytest.raises(IllegalTransition):
        store.write(WriteBatch(claims=[claim("C-1")], semantic=[orphan]))
    assert store.keys().get("p") is None and store.claims_active("p") == []
    store.sync()
    assert store.keys().get("p") is None
    store.write(WriteBatch(claims=[claim("C-1")]))  # a fresh key now, and its claim reads back
    assert store.keys().get("p") is not None and [c.content for c in store.claims_active("p")] == ["content"]


def test_entities_and_relationships_round_trip(store: Store) -> None:
    """Entities (name encrypted at rest by the codec) and relationships come back per patient."""
    from msm_mem._tier_records import Entity, Relationship

    store.write(
        WriteBatch(
            entities=[Entity("N-1", "p", "finding", "Pleural Effusion", 1.0)],
            relationships=[Relationship("R-1", "p", "C-1", "N-1", "asserts", 1.0)],
        )
    )
    assert [(e.entity_id, e.name) for e in store.entities("p")] == [("N-1", "Pleural Effusion")]
    assert [(r.source_id, r.target_id, r.type) for r in store.relationships("p")] == [("C-1", "N-1", "asserts")]
    assert store.entities("q") == [] and store.relationships("q") == []


def test_entities_and_relationships_are_retracted_by_state_change(store: Store) -> None:
    """A StateChange retracts an entity or relationship: it leaves the active graph; a wrong
    expected state is refused and changes nothing."""
    entities = [Entity("N-1", "p", "finding", "Edema", 1.0), Entity("N-2", "p", "finding", "Mass", 2.0)]
    store.write(WriteBatch(entities=entities, relationships=[Relationship("R-1", "p", "C-1", "N-1", "asserts", 1.0)]))
    store.write(
        WriteBatch(
            changes=[
                StateChange("entities", "N-1", State.ACTIVE, State.RETRACTED),
                StateChange("relationships", "R-1", State.ACTIVE, State.RETRACTED),
            ]
        )
    )
    assert [e.entity_id for e in store.entities("p")] == ["N-2"] and store.relationships("p") == []
    with pytest.raises(IllegalTransition):
        store.write(WriteBatch(changes=[StateChange("entities", "N-1", State.ACTIVE, State.RETRACTED)]))
    with pytest.raises(NotFound):
        store.write(WriteBatch(changes=[StateChange("relationships", "R-9", State.ACTIVE, State.RETRACTED)]))
    assert [e.entity_id for e in store.entities("p")] == ["N-2"]


def test_a_chained_write_continues_the_head_it_read(store: Store) -> None:
    """A write given a chainer hands it the stored head and appends its rows; rows that do not
    continue that head are refused and nothing of the batch is stored."""
    store.write(WriteBatch(audit=rows(2)))
    seen: list[tuple[int, str]] = []

    def chain(seq: int, head_hash: str) -> list[AuditRow]:
        seen.append((seq, head_hash))
        return rows(seq + 1)[seq:]

    store.write(WriteBatch(stm=[item(1)]), chain)
    assert seen == [(2, rows(2)[-1].event_hash)] and [r.seq for r in store.iter_audit()] == [1, 2, 3]
    with pytest.raises(InvalidInput):
        store.write(WriteBatch(stm=[item(2)]), lambda seq, head_hash: rows(seq + 2)[seq + 1 :])
    assert [r.seq for r in store.iter_audit()] == [1, 2, 3] and [i.item_id for i in store.stm_list(patient_id="p")] == [
        "M-1"
    ]


def test_the_digests_seen_inside_a_write_are_what_it_leaves(store: Store) -> None:
    """Inside a write's before_commit the store's row digests are those the write leaves (as
    stored and as recomputed after the commit); after a write that fails there, they are
    those before it again."""
    seen: list[object] = []
    store.write(WriteBatch(stm=[item(1)], audit=rows(1)), before_commit=lambda: seen.append(store.row_digests()))
    assert seen == [store.row_digests()] == [store.computed_row_digests()]
    before = store.row_digests()

    def fail() -> None:
        seen.append(store.row_digests())
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        store.write(WriteBatch(stm=[item(2)]), before_commit=fail)
    assert seen[-1] != before and store.row_digests() == before == store.computed_row_digests()


def _raw(store: Store, statement: str, args: tuple[object, ...]) -> None:
    """One statement (``?`` placeholders) on the store's own connection, around the store."""
    if hasattr(store, "_conn") and not hasattr(store, "schema"):
        store._conn.execute(statement, args)  # type: ignore[attr-defined]
    else:
        with store._db() as conn:  # type: ignore[attr-defined]
            conn.execute(statement.replace("?", "%s").encode(), args)


def test_the_rows_naming_a_needle_and_the_rows_that_fail_their_hash(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """iter_audit_naming gives, in seq order from start_seq, the rows whose bytes hold the
    needle and the rows that no longer match their hash, and nothing else (searched a few
    sequence numbers a statement on PostgreSQL, so its spans are crossed)."""
    monkeypatch.setattr("msm_mem._storage.postgres.audit_naming.NAMING_SPAN", 4)
    b = ChainBuilder()
    common = dict(time=1.0, actor="a", role="agent", action="read", source_tier="ltm", target_tier="stm")
    patients = ["pt-aa", "pt-bb", "pt-aa", "", "pt-bb", "pt-bb", "pt-aa", "pt-cc", "pt-bb", "pt-aa", "pt-bb"]
    chain = [AuditRow(*b.next(**common, purpose="treatment", outcome="success", patient=p).row()) for p in patients]
    store.write(WriteBatch(audit=chain))
    mine = [r.seq for r in chain if b'"pt-aa"' in r.payload]
    assert mine == [1, 3, 7, 10]
    assert [r for r in store.iter_audit_naming(b"pt-aa")] == [chain[s - 1] for s in mine]
    assert [r.seq for r in store.iter_audit_naming(b"pt-aa", 4)] == [7, 10]
    assert list(store.iter_audit_naming(b"pt-zz")) == []
    edited = chain[5].payload.replace(b"success", b"denied!")
    _raw(store, "UPDATE audit SET payload = ? WHERE seq = ?", (edited, 6))
    assert [r.seq for r in store.iter_audit_naming(b"pt-aa")] == [1, 3, 6, 7, 10]
    assert [r.payload for r in store.iter_audit_naming(b"pt-aa", 5)][0] == edited
    for bad in (b"", "pt-aa", None):
        with pytest.raises(InvalidInput):
            list(store.iter_audit_naming(bad))  # type: ignore[arg-type]
