"""Tests of evidence ranking (msm_mem._memory.ranking): composite_k, freshness, decay_at, rerank,
and the factors the agent returns in its evidence trail."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from msm_mem import Principal
from msm_mem._api.mem import MsmMem
from msm_mem._memory import ranking
from msm_mem._memory.ranking import (
    DAY,
    DECAY_THRESHOLD,
    HALF_LIFE_DAYS,
    TIER_WEIGHTS,
    Score,
    composite,
    decay_at,
    freshness,
    rerank,
)
from msm_mem._records import EpisodicRecord, Hit, Impression, SemanticState
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import AGENT

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
    confidence=st.floats(0.06, 1.0),
    tier=st.sampled_from(sorted(TIER_WEIGHTS)),
    kind=st.sampled_from(sorted(HALF_LIFE_DAYS)),
)
def test_decay_at_is_when_composite_reaches_the_threshold(confidence: float, tier: str, kind: str) -> None:
    """At decay_at the composite aged from created_at equals DECAY_THRESHOLD (formula and meaning)."""
    start = confidence * TIER_WEIGHTS[tier]
    when = decay_at(T0, confidence, tier, kind)
    if start <= DECAY_THRESHOLD:
        assert when == T0
        return
    assert when == pytest.approx(T0 + HALF_LIFE_DAYS[kind] * DAY * math.log2(start / DECAY_THRESHOLD))
    assert composite(confidence, when - T0, tier, kind) == pytest.approx(DECAY_THRESHOLD, rel=1e-6)


def test_decay_at_immediate_below_threshold_and_later_for_stronger_evidence() -> None:
    """Weak evidence decays at once; a critic verdict outlives the agent's impression."""
    assert decay_at(T0, 0.05, "report", "claims") == T0
    assert decay_at(T0, 0.01, "agent", "claims") == T0
    assert decay_at(T0, 1.0, "critic", "claims") > decay_at(T0, 0.6, "agent", "claims") > T0


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
    """Equal ranks keep a deterministic order."""
    a = _episode("E-a", 1.0, "agent", T0)
    b = _episode("E-b", 1.0, "agent", T0)
    hits = [Hit("E-b", "episodic", 0.5, b), Hit("E-a", "episodic", 0.5, a)]
    assert [h.id for h, _ in rerank(hits, T0)] == ["E-a", "E-b"]


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
    assert kinds == {"semantic", "episodic", "visual"}
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
    mem._maintainer().critic_verdict(
        Principal("rad-1", "critic"), "P1", "S1", accept=False, correction="Right lower lobe consolidation, pneumonia"
    )
    answer = mem.ask(AGENT, "P1", _png(tmp_path, 2), "Any change?", study_id="S2", write_back=False)
    episodic = [e for e in answer.evidence if e.kind == "episodic"]
    assert len(episodic) == 1
    assert (episodic[0].confidence, episodic[0].tier_weight) == (1.0, TIER_WEIGHTS["critic"])
