"""Governed turns begun as one batch (``GovernedMemory.begin_many``) and committed together, on
both stores: they store what turns begun one at a time store, and a batch that fails in the
middle of its transaction leaves nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from msm_mem import ConsentRecord, MsmMem
from msm_mem._errors import ConsentDenied, IllegalTransition, InvalidInput, InvalidVector, WriteConflict
from msm_mem._records import SemanticState, new_id
from msm_mem._storage.base import WriteBatch
from msm_mem.testing import FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, audit_events
from tests.layers import Layers, layers_of

T0 = 1.7e9
PATIENTS = [f"P{i}" for i in range(6)]
ANSWERS = [
    "Right lower lobe consolidation, likely pneumonia.",
    "Small left pleural effusion. No pneumothorax.",
    "No acute cardiopulmonary abnormality.",
]


@pytest.fixture
def made(new_mem: MemFactory) -> Iterator[Callable[..., tuple[MsmMem, Layers]]]:
    """A factory of new stores (``new_mem``, on a fixed clock at ``start`` when given) and their
    layers, built through their own constructors; the layers are closed afterwards."""
    opened: list[Layers] = []

    def make(name: str, start: float | None = None) -> tuple[MsmMem, Layers]:
        clock = None if start is None else FixedClock(start)
        mem = new_mem(name) if clock is None else new_mem(name, clock=clock)
        opened.append(layers_of(mem, clock))
        return mem, opened[-1]

    yield make
    for layers in opened:
        layers.close()


def _vectors(layers: Layers, n: int, seed: int = 0) -> np.ndarray:
    z = np.random.default_rng(seed).standard_normal((n, layers.store.dim)).astype(np.float32)
    out: np.ndarray = z / np.linalg.norm(z, axis=1, keepdims=True)
    return out


def _stage(layers: Layers, turns: Sequence[Any], round_: int, z: np.ndarray) -> list[tuple[Any, ...]]:
    """Observe and consolidate one image a turn; the gate's decision of each."""
    decisions = []
    for i, turn in enumerate(turns):
        item = layers.gm.observe(turn, z[i], "What is the impression?", timestamp=T0 + round_, study_id=f"S{round_}")
        result = layers.gm.consolidate(turn, item, ANSWERS[(i + round_) % len(ANSWERS)], decision="treat")
        decisions.append((result.gate.written, result.gate.reasons, result.gate.max_cosine))
    return decisions


def _run(layers: Layers, batched: bool, rounds: int = 3, ahead: bool = False) -> list[tuple[Any, ...]]:
    """Batches over the same patients: the later ones supersede semantic states and claims, and
    the third shows the images of the first again (the gate's novelty check finds them);
    ``ahead``: the novelty searches are read ahead with the batch. The gate's decisions."""
    gm = layers.gm
    decisions = []
    for round_ in range(rounds):
        z = _vectors(layers, len(PATIENTS), seed=round_ % 2)
        if not batched:
            turns = [gm.begin(AGENT, p) for p in PATIENTS]
        elif ahead:
            turns = gm.begin_many(AGENT, PATIENTS, novelty=list(zip(PATIENTS, z, strict=True)))
        else:
            turns = gm.begin_many(AGENT, PATIENTS)
        decisions += _stage(layers, turns, round_, z)
        gm.commit_many(turns)
    return decisions


def _content(layers: Layers) -> dict[str, Any]:
    """What the store holds, without the random parts (ids, nonces, pseudonyms, hashes)."""
    s = layers.store
    out: dict[str, Any] = {
        "counts": [s.count("episodic"), s.count("visual"), s.count("semantic"), len(s.stm_list())],
        "stm": sorted((i.patient_id, i.state.value, i.payload is None) for i in s.stm_list()),
    }
    for p in PATIENTS:
        out[p] = (
            [(x.category, x.version, x.state, x.impressions, x.supersedes is not None) for x in s.semantic_active(p)],
            [(c.key, c.content, c.state, c.confidence, c.supersedes is not None) for c in s.claims_active(p)],
            sorted((e.type, e.name, e.state) for e in s.entities(p)),  # (same times: ordered by random id)
            sorted((r.type, r.state) for r in s.relationships(p)),
            [len(s.semantic_history(p, x.category)) for x in s.semantic_active(p)],
        )
    out["audit"] = [
        (e.actor, e.action, e.source_tier, e.target_tier, e.outcome, e.reason, len(e.record_ids), bool(e.patient))
        for e in audit_events(s)
    ]
    return out


def _digests_verify(mem: MsmMem, layers: Layers) -> None:
    assert layers.store.row_digests() == layers.store.computed_row_digests()
    assert mem.verify_audit(ADMIN).ok


def test_batched_turns_store_what_single_turns_store(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """Same records, states, claims, entities and audit events as turns begun one by one."""
    single, batched = made("single", T0), made("batched", T0)
    for mem, layers in (single, batched):
        layers.audit.pseudonym(PATIENTS[0])  # one patient with a key before its first turn, the rest without
        mem.grant(
            ADMIN,
            [ConsentRecord(new_id("C"), PATIENTS[1], "role:agent", "treatment", "permit", ("*",), 0.0, None, T0)],
        )
    decided = _run(single[1], batched=False)
    assert _run(batched[1], batched=True) == decided
    assert _content(batched[1]) == _content(single[1])
    # the first two rounds were written, each superseding the semantic state; the third showed
    # the first round's images again: held, so it reached no long-term memory
    assert [written for written, _, _ in decided] == [True] * (2 * len(PATIENTS)) + [False] * len(PATIENTS)
    assert _content(batched[1])["counts"][2] == 2 * len(PATIENTS)
    for mem, layers in (single, batched):
        _digests_verify(mem, layers)


def test_novelty_read_ahead_gives_the_gate_what_each_search_gives(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """The novelty searches read ahead with a batch give the gate the scores the turns' own
    searches give (the third round's images are the first round's: the gate holds them)."""
    single, ahead = made("single", T0), made("ahead", T0)
    decided = _run(single[1], batched=False)
    assert _run(ahead[1], batched=True, ahead=True) == decided
    assert _content(ahead[1]) == _content(single[1])
    seen = decided[2 * len(PATIENTS) :]
    assert all(score is not None and score > 0.999 and not written for written, _, score in seen)
    assert all(d[2] is None for d in decided[: len(PATIENTS)])  # no stored image at first
    _digests_verify(*ahead)


def test_novelty_read_ahead_refuses_bad_pairs(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """``novelty`` takes (patient of the batch, embedding) pairs; anything else is refused
    before anything is read or audited."""
    _, layers = made("bad-novelty")
    gm = layers.gm
    z = _vectors(layers, 1)[0]
    before = len(audit_events(layers.store))
    for novelty, error, message in (
        ([("P9", z)], InvalidInput, "no turn in this batch"),
        ([("P1",)], InvalidInput, "pairs"),
        ("P1", InvalidInput, "pairs"),
        ([["P1", z, z]], InvalidInput, "pairs"),
        ([("P1", z[:-1])], InvalidVector, "dimension"),
        ([("P1", np.full_like(z, np.nan))], InvalidVector, "NaN"),
    ):
        with pytest.raises(error, match=message):
            gm.begin_many(AGENT, ["P1", "P2"], novelty=novelty)  # type: ignore[arg-type]
    assert len(audit_events(layers.store)) == before


def test_reads_of_a_batch_are_the_reads_of_single_turns(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """Within a batch, each turn reads exactly what the store answers without a read-ahead."""
    _, layers = made("reads", T0)
    _run(layers, batched=True, rounds=2)
    s = layers.handle  # the handle that wrote: a sync before each read would drop what was read ahead
    plain = {p: (s.consents(p), s.semantic_active(p), s.claims_active(p), s.entities(p)) for p in PATIENTS}
    s.sync()
    s.prefetch([*PATIENTS, "P-unknown"])
    for p in PATIENTS:
        assert (s.consents(p), s.semantic_active(p), s.claims_active(p), s.entities(p)) == plain[p]
        for c in plain[p][2]:
            assert s.claims_active(p, c.key) == [c]
        for x in plain[p][1]:
            assert s.semantic_active(p, x.category) == [x]
    assert s.semantic_active("P-unknown") == [] and s.entities("P-unknown") == []


def test_a_batch_sees_its_own_commit_at_once(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """A commit of this store drops what was read ahead: the next turns read the new states."""
    mem, layers = made("own", T0)
    gm = layers.gm
    turns = gm.begin_many(AGENT, PATIENTS[:2])
    _stage(layers, turns[:1], 0, _vectors(layers, 1))
    gm.commit_many(turns[:1])
    (state,) = layers.store.semantic_active(PATIENTS[0])
    assert state.version == 1
    _stage(layers, turns[1:], 0, _vectors(layers, 1, seed=5))  # the other turn of the batch still stages
    gm.commit_many(turns[1:])
    assert [x.version for x in layers.store.semantic_active(PATIENTS[1])] == [1]
    _digests_verify(mem, layers)


def test_begin_many_refuses_bad_batches_before_reading(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """Bad principals, ids, repeats or a lone string are refused; nothing is audited for them."""
    _, layers = made("bad")
    gm = layers.gm
    before = len(audit_events(layers.store))
    for patients, message in (
        (["P1", "P1"], "different patients"),
        ("P1", "sequence of patient ids"),
        (["P1", ""], "patient scope"),
        (["P1", "*"], "patient_id"),
    ):
        with pytest.raises(InvalidInput, match=message):
            gm.begin_many(AGENT, patients)
    with pytest.raises(InvalidInput, match="Principal"):
        gm.begin_many("agent", ["P1"])  # type: ignore[arg-type]
    assert len(audit_events(layers.store)) == before
    assert gm.begin_many(AGENT, []) == []


def test_a_denied_patient_stops_the_batch_and_is_audited(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """The first patient without consent raises ConsentDenied after auditing the denial, as begin does."""
    mem, layers = made("deny", T0)
    mem.grant(ADMIN, [ConsentRecord(new_id("C"), "P2", "role:agent", "treatment", "deny", ("*",), 0.0, None, T0 - 1)])
    with pytest.raises(ConsentDenied):
        layers.gm.begin_many(AGENT, ["P1", "P2", "P3"])
    denied = [e for e in audit_events(layers.store) if e.action == "consent"]
    assert [e.outcome for e in denied] == ["denied"]


def _counts(layers: Layers) -> tuple[int, ...]:
    s = layers.store
    claims = sum(len(s.claims_active(p)) for p in PATIENTS)
    return (s.count("episodic"), s.count("visual"), s.count("semantic"), len(s.stm_list()), claims, s.audit_head()[0])


def test_a_batch_refused_mid_transaction_leaves_nothing(made: Callable[..., tuple[MsmMem, Layers]]) -> None:
    """A supersession that another writer made stale, or a duplicate record id, fails the whole
    batch after its first rows were sent: nothing is stored, and the store goes on working."""
    mem, layers = made("fail", T0)
    gm = layers.gm
    _run(layers, batched=True, rounds=1)

    # 1. a later patient's semantic state was superseded by someone else after the batch began
    turns = gm.begin_many(AGENT, PATIENTS)
    _stage(layers, turns, 1, _vectors(layers, len(PATIENTS), seed=1))
    (stale,) = layers.store.semantic_active(PATIENTS[-1])
    newer = SemanticState(
        new_id("S"), PATIENTS[-1], stale.category, stale.impressions, stale.version + 1, supersedes=stale.state_id
    )
    layers.store.write(WriteBatch(semantic=[newer]))
    before, digests = _counts(layers), layers.store.row_digests()
    with pytest.raises(IllegalTransition):
        gm.commit_many(turns)
    assert _counts(layers) == before and layers.store.row_digests() == digests

    # 2. a duplicate episode id among the batch's rows (refused by the table's constraint)
    turns = gm.begin_many(AGENT, PATIENTS[:3])
    _stage(layers, turns, 2, _vectors(layers, 3, seed=2))
    turns[2].batch.episodes.append(turns[0].batch.episodes[0])
    with pytest.raises(WriteConflict, match="stored already"):
        gm.commit_many(turns)
    assert _counts(layers) == before and layers.store.row_digests() == digests

    # 3. a second active version of a semantic key, sent behind other rows: refused at its insert
    (active,) = layers.store.semantic_active(PATIENTS[0])
    twin = SemanticState(new_id("S"), PATIENTS[0], active.category, active.impressions, active.version + 1)
    turns = gm.begin_many(AGENT, PATIENTS[1:3])
    _stage(layers, turns, 2, _vectors(layers, 2, seed=4))
    batch = WriteBatch(episodes=list(turns[0].batch.episodes), semantic=[twin])
    with pytest.raises(IllegalTransition, match="already has an active version"):
        layers.store.write(batch)
    assert _counts(layers) == before and layers.store.row_digests() == digests

    # the store still works: a good batch commits, and everything verifies
    turns = gm.begin_many(AGENT, PATIENTS[:3])
    _stage(layers, turns, 3, _vectors(layers, 3, seed=3))
    gm.commit_many(turns)
    assert _counts(layers)[0] > before[0]
    _digests_verify(mem, layers)
