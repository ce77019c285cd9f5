"""Tests of evidence ranking (msm_mem._memory.ranking): composite_k, freshness, decay_at, rerank,
and the factors the agent returns in its evidence trail."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from msm_mem import ManifestRow, Principal
from msm_mem._api.mem import MsmMem
from msm_mem._memory import ranking
from msm_mem._memory.ranking import (
    DAY,
    HALF_LIFE_DAYS,
    TIER_WEIGHTS,
    Score,
    composite,
    decay_at,
    freshness,
    rerank,
)
from msm_mem._records import EpisodicRecord, Hit, Impression, SemanticState
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.plugins.backbones.nonparametric import NonparametricBackbone
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import AGENT, CRITIC, INGEST, SYSTEM
from tests.layers import layers_of

CHECK = CRITIC  # reads memory in the tests below

T0 = 1_700_000_000.0
ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"


def _png(folder: Path, seed: int) -> Path:
    path = folder / f"img{seed}.png"
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8), mode="L").save(path)
    return path


def _episode(eid: str, confidence: float, tier: str, timestamp: float) -> EpisodicRecord:
    z = np.zeros(4, dtype=np.float32)
    z[0] = 1.0
    return EpisodicRecord(
        episode_id=eid,
        patient_id="P1",
        timestamp=timestamp,
        z=z,
        question="q?",
        answer="a",
        confidence=confidence,
        evidence_tier=tier,
    )


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mem(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    m = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "treat"))
    yield m
    m.close()


def test_composite_is_the_product_of_its_factors() -> None:
    """composite_k = confidence x freshness x tier weight."""
    age = 100 * DAY
    expected = 0.7 * 0.5 ** (100 / HALF_LIFE_DAYS["episodic"]) * TIER_WEIGHTS["clinician"]
    assert composite(0.7, age, "clinician", "episodic") == pytest.approx(expected)
    score = Score(0.8, 0.7, freshness(age, "episodic"), TIER_WEIGHTS["clinician"])
    assert score.composite == pytest.approx(expected)
    assert score.rank == pytest.approx(0.8 * expected)


@pytest.mark.parametrize("kind", sorted(HALF_LIFE_DAYS))
def test_freshness_halves_every_half_life(kind: str) -> None:
    """freshness is 1 at age 0, 1/2 after one half-life, 1/4 after two."""
    half = HALF_LIFE_DAYS[kind] * DAY
    assert freshness(0.0, kind) == 1.0
    assert freshness(half, kind) == pytest.approx(0.5)
    assert freshness(2 * half, kind) == pytest.approx(0.25)


def test_freshness_clamps_negative_age_and_defaults_unknown_kinds() -> None:
    """Evidence from the future counts as new; an unknown kind uses a one-year half-life."""
    assert freshness(-5 * DAY, "episodic") == 1.0
    assert freshness(365 * DAY, "unknown") == pytest.approx(0.5)


def test_semantic_memory_ages_faster() -> None:
    """The semantic half-life is shorter than the episodic one."""
    assert freshness(90 * DAY, "semantic") < freshness(90 * DAY, "episodic")


def test_tier_weights_order() -> None:
    """A signed report outranks a critic, a clinician, the agent and population experience."""
    w = TIER_WEIGHTS
    assert w["report"] >= w["critic"] > w["clinician"] > w["agent"] > w["population"]
    assert ranking.tier_weight("made-up") == ranking.DEFAULT_TIER_WEIGHT


@given(
    confidence=st.floats(0.0, 1.0),
    tier=st.sampled_from(sorted(TIER_WEIGHTS)),
    retention=st.floats(1.0, 150 * 365.25 * DAY),
)
def test_decay_at_is_last_activity_plus_scaled_retention(confidence: float, tier: str, retention: float) -> None:
    """decay_at is the last activity plus retention x confidence x tier weight, never before it."""
    when = decay_at(T0, confidence, tier, retention)
    assert when == T0 + retention * (confidence * TIER_WEIGHTS[tier])
    assert T0 <= when <= T0 + retention


def test_decay_at_keeps_full_retention_for_full_trust_and_less_for_weaker_evidence() -> None:
    """A ground-truth record keeps the whole retention; a critic outlives the agent; confidence 0 goes at once."""
    year = 365.25 * DAY
    assert decay_at(T0, 1.0, "ground_truth", 10 * year) == T0 + 10 * year
    assert decay_at(T0, 1.0, "critic", 10 * year) > decay_at(T0, 0.6, "agent", 10 * year) > T0
    assert decay_at(T0, 0.0, "report", 10 * year) == T0
    assert decay_at(T0, 0.5, "agent", 10 * year, "semantic") == T0 + 10 * year  # the summary keeps it all


def test_rerank_orders_by_cosine_times_composite() -> None:
    """A less similar but stronger, fresher record can outrank a closer weak one."""
    weak = _episode("E-weak", 0.3, "agent", T0 - 700 * DAY)
    strong = _episode("E-strong", 1.0, "report", T0)
    hits = [Hit("E-weak", "episodic", 0.95, weak), Hit("E-strong", "episodic", 0.6, strong)]
    ranked = rerank(hits, T0)
    assert [h.id for h, _ in ranked] == ["E-strong", "E-weak"]
    for h, sc in ranked:
        r = h.record
        assert isinstance(r, EpisodicRecord)
        assert sc.cosine == h.score and sc.confidence == r.confidence
        assert sc.freshness == pytest.approx(freshness(T0 - r.timestamp, "episodic"))
        assert sc.tier_weight == TIER_WEIGHTS[r.evidence_tier]
    assert ranked[0][1].rank > ranked[1][1].rank


def test_rerank_ties_break_by_cosine_then_id() -> None:
    """Equal ranks of records alike in all but their ids keep one order whichever comes first
    (the id decides last)."""
    a = _episode("E-a", 1.0, "agent", T0)
    b = _episode("E-b", 1.0, "agent", T0)
    hits = [Hit("E-b", "episodic", 0.5, b), Hit("E-a", "episodic", 0.5, a)]
    assert [h.id for h, _ in rerank(hits, T0)] == [h.id for h, _ in rerank(hits[::-1], T0)] == ["E-a", "E-b"]


@pytest.mark.parametrize("ids", [("E-a", "E-z"), ("E-z", "E-a")])
def test_rerank_ties_put_the_newer_evidence_first_whatever_the_ids(ids: tuple[str, str]) -> None:
    """Equal ranks and cosines (all fresh at the query) list the newer study first and, of one
    time, the later study id first (ingestion's order), never by the random ids."""
    newer, older = ids
    records = [
        replace(_episode(older, 1.0, "agent", T0 + DAY), study_id="S1"),
        replace(_episode(newer, 1.0, "agent", T0 + 2 * DAY), study_id="S3"),
        replace(_episode("E-0", 1.0, "agent", T0 + 2 * DAY), study_id="S2"),
    ]
    hits = [Hit(r.episode_id, "episodic", 0.5, r) for r in records]
    ranked = rerank(hits, T0)
    assert len({sc.rank for _, sc in ranked}) == 1
    assert [h.record.study_id for h, _ in ranked] == ["S3", "S2", "S1"]  # type: ignore[union-attr]


def test_semantic_hit_scores_its_last_impression() -> None:
    """A semantic state has confidence 1 and ages from its newest impression, on the semantic half-life."""
    state = SemanticState("S-1", "P1", "impression", (Impression(T0 - 180 * DAY, "old text"),), evidence_tier="critic")
    ((_, sc),) = rerank([Hit("S-1", "semantic", 1.0, state)], T0)
    assert (sc.cosine, sc.confidence, sc.tier_weight) == (1.0, 1.0, TIER_WEIGHTS["critic"])
    assert sc.freshness == pytest.approx(0.5)


def test_agent_evidence_trail_carries_every_factor(mem: MsmMem, clock: FixedClock, tmp_path: Path) -> None:
    """Each Evidence line has score == cosine x confidence x freshness x tier_weight, sorted by score."""
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    clock.advance(200 * DAY)
    answer = mem.ask(AGENT, "P1", _png(tmp_path, 2), "Any change?", study_id="S2")
    kinds = {e.kind for e in answer.evidence}
    assert kinds == {"semantic", "episodic", "visual", "claim"}
    for e in answer.evidence:
        assert e.score == pytest.approx(e.cosine * e.confidence * e.freshness * e.tier_weight)
        assert -1.0 <= e.cosine <= 1.0 and 0.0 < e.freshness <= 1.0
        if e.kind != "semantic":
            # the first study was the agent's own impression, 200 days old
            assert e.confidence == 0.6 and e.tier_weight == TIER_WEIGHTS["agent"]
            assert e.freshness == pytest.approx(0.5 ** (200 / 365))
    scores = [e.score for e in answer.evidence]
    assert scores == sorted(scores, reverse=True)
    shape = answer.evidence[0].to_json()
    assert set(shape) == {"id", "kind", "score", "cosine", "confidence", "freshness", "tier_weight"}


def test_critic_verdict_raises_the_rank_of_corrected_evidence(mem: MsmMem, tmp_path: Path) -> None:
    """After a critic's correction the corrected episode ranks with the critic's confidence and weight."""

    image = _png(tmp_path, 1)
    mem.ask(AGENT, "P1", image, "Any consolidation?", study_id="S1")
    mem.feedback(
        Principal("rad-1", "critic"), "P1", "S1", accept=False, correction="Right lower lobe consolidation, pneumonia"
    )
    answer = mem.ask(AGENT, "P1", _png(tmp_path, 2), "Any change?", study_id="S2", write_back=False)
    episodic = [e for e in answer.evidence if e.kind == "episodic"]
    assert len(episodic) == 1
    assert (episodic[0].confidence, episodic[0].tier_weight) == (1.0, TIER_WEIGHTS["critic"])


# one notion of time, claims as evidence, verified first ------------------------------------------

Y2020 = 1_590_000_000.0  # May 2020: a study of a retrospective data set, asked about years later
GT = "Left lower lobe consolidation, pneumonia"
WRONG = "Large right pneumothorax with mediastinal shift"


class Switch:
    """Answers ``answer`` while it is set, else votes like the nonparametric backbone."""

    name = "switch"

    def __init__(self, answer: str | None = None) -> None:
        self.answer = answer

    def generate(self, request: BackboneRequest) -> BackboneReply:
        if self.answer is not None:
            return BackboneReply(self.answer, source="memory")
        return NonparametricBackbone().generate(request)


def _ingest(mem: MsmMem, tmp_path: Path, seed: int, study: str, when: float, answer: str = GT) -> None:
    row = ManifestRow("P1", study, when, str(_png(tmp_path, seed)), "Findings?", answer)
    assert mem.ingest(INGEST, [row]).ingested == 1


@pytest.fixture
def late(new_mem: MemFactory) -> Iterator[tuple[MsmMem, FixedClock, Switch]]:
    """A store whose clock reads 2026 (data ingested years after it was acquired)."""
    clock, bb = FixedClock(T0 + 3 * 365 * DAY), Switch()
    m = new_mem("late", clock=clock, backbone=bb)
    yield m, clock, bb
    m.close()


def test_freshness_is_measured_in_clinical_time(late: tuple[MsmMem, FixedClock, Switch], tmp_path: Path) -> None:
    """2020 evidence asked about from a 2020 study a month later is a month old, whenever it was ingested."""
    mem, _, _ = late
    _ingest(mem, tmp_path, 1, "S1", Y2020)
    a = mem.ask(AGENT, "P1", _png(tmp_path, 2), "Findings?", timestamp=Y2020 + 30 * DAY, write_back=False)
    episodic = [e for e in a.evidence if e.kind == "episodic"]
    assert episodic and episodic[0].freshness == pytest.approx(0.5 ** (30 / HALF_LIFE_DAYS["episodic"]))
    assert a.answer == GT


def test_the_query_time_defaults_to_the_asked_studys_time(
    late: tuple[MsmMem, FixedClock, Switch], tmp_path: Path
) -> None:
    """Asking about a known study without a timestamp dates the query at the study, not at the clock."""
    mem, _, _ = late
    _ingest(mem, tmp_path, 1, "S1", Y2020)
    a = mem.ask(AGENT, "P1", _png(tmp_path, 1), "Findings?", study_id="S1", write_back=False)
    assert {e.freshness for e in a.evidence} == {1.0}


def test_decay_counts_from_the_last_activity(late: tuple[MsmMem, FixedClock, Switch], tmp_path: Path) -> None:
    """decay_at is the patient's last write plus the retention, not the study time: 2020 data ingested in 2026 stays."""
    mem, clock, _ = late
    _ingest(mem, tmp_path, 1, "S1", Y2020)
    (e,) = mem.episodes(CHECK, "P1")
    (c,) = mem.claims(CHECK, "P1")
    keep = mem.settings.retention_s
    assert e.decay_at == decay_at(clock.now(), 1.0, "ground_truth", keep)
    assert c.decay_at == decay_at(clock.now(), 1.0, "ground_truth", keep)
    report = mem.maintain(SYSTEM)
    assert (report.anonymized, report.retracted) == (0, 0) and mem.episodes(CHECK, "P1") == [e]


def test_decay_at_moves_with_the_patients_newest_write(new_mem: MemFactory, tmp_path: Path) -> None:
    """A study ingested later moves every record of the patient (none rewritten), whatever its clinical date."""
    clock = FixedClock(Y2020 + DAY)
    mem = new_mem("a", clock=clock)
    _ingest(mem, tmp_path, 1, "S1", Y2020)
    first = mem.episodes(CHECK, "P1")[0]
    clock.advance(300 * DAY)
    _ingest(mem, tmp_path, 2, "S0", Y2020 - 5 * 365 * DAY)  # an older study, written now
    moved = {e.episode_id: e.decay_at for e in mem.episodes(CHECK, "P1")}
    assert moved[first.episode_id] == first.decay_at + 300 * DAY
    assert len(set(moved.values())) == 1
    with layers_of(mem, clock) as layers:
        stored = layers.store.get_episodes([first.episode_id])[0]
    assert stored.decay_at is None  # decided when read, never stored


def _hit(hid: str, kind: str, tier: str, when: float, cosine: float, patient: str = "P1") -> Hit:
    z = np.zeros(4, dtype=np.float32)
    z[0] = 1.0
    if kind == "semantic":
        return Hit(
            hid,
            "semantic",
            1.0,
            SemanticState(hid, patient, "impression", (Impression(when, "x"),), evidence_tier=tier),
        )
    record = EpisodicRecord(
        hid, patient, when, z, "q?", "a", confidence=1.0 if tier != "agent" else 0.6, evidence_tier=tier
    )
    return Hit(hid, "episodic", cosine, record)


def test_a_verified_record_outranks_the_agents_semantic_state_about_its_study() -> None:
    """The agent's own impression of a study ranks no higher than that study's ground truth."""
    truth = _hit("E-gt", "episodic", "ground_truth", T0 - DAY, 0.4)
    own = _hit("S-agent", "semantic", "agent", T0 - DAY, 1.0)
    other = _hit("S-other", "semantic", "agent", T0 - 2 * DAY, 1.0, patient="P2")
    ranked = rerank([own, truth, other], T0)
    order = [h.id for h, _ in ranked]
    assert order.index("E-gt") < order.index("S-agent")
    scores = {h.id: sc for h, sc in ranked}
    assert scores["S-agent"].rank == pytest.approx(scores["E-gt"].rank)  # capped at the verified rank
    assert scores["S-other"].cap == math.inf  # another study (and patient): no cap


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["episodic", "semantic"]),
            st.sampled_from(sorted(TIER_WEIGHTS)),
            st.integers(0, 3),
            st.floats(-1.0, 1.0),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_verified_never_ranks_below_unverified_about_the_same_study(
    specs: list[tuple[str, str, int, float]],
) -> None:
    """Property: within every study, the lowest verified rank is at least the highest unverified one."""
    hits = [_hit(f"H{i}", kind, tier, T0 - 40 * DAY * t, cos) for i, (kind, tier, t, cos) in enumerate(specs)]
    ranked = rerank(hits, T0)
    for t in range(4):
        when = T0 - 40 * DAY * t
        mine = [(h, sc) for h, sc in ranked if ranking.clinical_time(h) == when]
        good = [sc.rank for h, sc in mine if ranking.verified(h.record.evidence_tier)]
        bad = [sc.rank for h, sc in mine if not ranking.verified(h.record.evidence_tier)]
        if good and bad:
            assert min(good) >= max(bad)
            pos = [i for i, (h, _) in enumerate(ranked) if ranking.clinical_time(h) == when]
            first_bad = min(i for i in pos if not ranking.verified(ranked[i][0].record.evidence_tier))
            assert all(i < first_bad for i in pos if ranking.verified(ranked[i][0].record.evidence_tier)) or min(
                good
            ) == max(bad)


def test_ground_truth_wins_over_the_agents_unverified_answer_about_its_study(
    late: tuple[MsmMem, FixedClock, Switch], tmp_path: Path
) -> None:
    """The agent's held answer about an ingested study reaches neither the semantic state nor a
    claim: the study's ground truth stays, and answers the next ask."""
    mem, _, bb = late
    _ingest(mem, tmp_path, 1, "S1", Y2020)
    (before,) = mem.semantic_state(CHECK, "P1")
    bb.answer = WRONG
    held = mem.ask(AGENT, "P1", _png(tmp_path, 1), "Findings?", study_id="S1")  # the same image: held
    assert held.gate is not None and not held.gate.written
    assert mem.semantic_state(CHECK, "P1") == [before] and before.evidence_tier == "ground_truth"
    assert {(c.content, c.evidence_tier) for c in mem.claims(CHECK, "P1")} == {(GT, "ground_truth")}
    bb.answer = None
    a = mem.ask(AGENT, "P1", _png(tmp_path, 2), "Findings?", timestamp=Y2020 + 10 * DAY, write_back=False)
    assert a.answer == GT
    by_kind = {e.kind: e for e in a.evidence}
    assert by_kind["semantic"].evidence_tier == by_kind["episodic"].evidence_tier == "ground_truth"


def test_claims_are_ranked_evidence_with_their_studys_cosine(
    late: tuple[MsmMem, FixedClock, Switch], tmp_path: Path
) -> None:
    """A study claim is evidence of kind claim: the cosine of its study's image, cosine x composite, in the prompt."""
    mem, _, _ = late
    _ingest(mem, tmp_path, 1, "S1", Y2020)
    a = mem.ask(AGENT, "P1", _png(tmp_path, 2), "Findings?", timestamp=Y2020 + 10 * DAY, write_back=False)
    (claim,) = [e for e in a.evidence if e.kind == "claim"]
    (episode,) = [e for e in a.evidence if e.kind == "episodic"]
    assert claim.cosine == pytest.approx(episode.cosine)
    assert claim.score == pytest.approx(claim.cosine * claim.confidence * claim.freshness * claim.tier_weight)
    assert claim.freshness == pytest.approx(0.5 ** (10 / HALF_LIFE_DAYS["claims"]))
    assert f"[{claim.id}]" in a.prompt and "## Study claims" in a.prompt
    assert dict(zip((e.id for e in a.evidence), a.studies, strict=True))[claim.id] == "S1"
