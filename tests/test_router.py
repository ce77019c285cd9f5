"""The router: retrieval features, expert weights, fixed and learned routers, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import InvalidInput
from msm_mem._agent.router import (
    FEATURE_NAMES,
    ExpertWeights,
    FixedRouter,
    LearnedRouter,
    RouterExample,
    RouterFeatures,
    features_from,
    fit_router,
    label_example,
)
from msm_mem._memory.ranking import Score
from msm_mem._records import EpisodicRecord, Hit, Impression, SemanticState, VisualRecord
from msm_mem.plugins.backbones.base import Candidate

DAY = 86_400.0
Z = np.ones(4, dtype=np.float32) / 2.0


def pair(rec: EpisodicRecord | VisualRecord | SemanticState, cos: float = 1.0) -> tuple[Hit, Score]:
    if isinstance(rec, EpisodicRecord):
        h = Hit(rec.episode_id, "episodic", cos, rec)
    elif isinstance(rec, VisualRecord):
        h = Hit(rec.visual_id, "visual", cos, rec)
    else:
        h = Hit(rec.state_id, "semantic", 1.0, rec)
    return h, Score(h.score, 1.0, 1.0, 1.0)


def cand(i: str, kind: str, text: str, weight: float, time: float = 0.0) -> Candidate:
    return Candidate(i, kind, text, "", weight, time)


# features --------------------------------------------------------------------------------------


def test_features_from_counts_cosines_recency_and_history() -> None:
    """Top cosine and count per memory, age of the newest evidence in days, semantic length."""
    at = 100 * DAY
    hits = [
        pair(EpisodicRecord("E-1", "p", 90 * DAY, Z, "q", "a"), 0.8),
        pair(EpisodicRecord("E-2", "p", 95 * DAY, Z, "q", "a"), 0.6),
        pair(VisualRecord("V-1", "p", 80 * DAY, Z), 0.7),
        pair(SemanticState("S-1", "p", "impression", (Impression(97 * DAY, "x"), Impression(98 * DAY, "y")))),
    ]
    f = features_from(hits, at)
    assert f == RouterFeatures(0.8, 0.7, 2, 1, 2.0, 2)


def test_features_of_nothing_and_their_vector() -> None:
    """No evidence: no cosines, zero counts, unknown age; the vector is bounded and named."""
    f = features_from([], 5.0)
    assert f == RouterFeatures()
    v = f.vector()
    assert v.shape == (len(FEATURE_NAMES),)
    assert v.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    full = RouterFeatures(1.0, -1.0, 50, 10, 10_000.0, 9).vector()
    assert full.tolist() == [1.0, -1.0, 1.0, 1.0, 1.0, 1.0]  # counts, age and history saturate


def test_evidence_from_the_future_has_age_zero() -> None:
    """Evidence time-stamped after the query counts as age 0, not negative."""
    f = features_from([pair(EpisodicRecord("E-1", "p", 10 * DAY, Z, "q", "a"), 0.5)], 5 * DAY)
    assert f.newest_age_days == 0.0
    assert f.vector()[FEATURE_NAMES.index("recency")] == 0.0


@given(
    cos_e=st.one_of(st.none(), st.floats(-1, 1)),
    cos_v=st.one_of(st.none(), st.floats(-1, 1)),
    n_e=st.integers(0, 1000),
    n_v=st.integers(0, 1000),
    age=st.one_of(st.none(), st.floats(0, 1e6)),
    sem=st.integers(0, 100),
)
def test_feature_vector_is_always_bounded(
    cos_e: float | None, cos_v: float | None, n_e: int, n_v: int, age: float | None, sem: int
) -> None:
    """Every feature lies in [-1, 1] (cosines) or [0, 1] (the rest), whatever the inputs."""
    v = RouterFeatures(cos_e, cos_v, n_e, n_v, age, sem).vector()
    assert np.all(np.isfinite(v))
    assert np.all(v[:2] >= -1.0) and np.all(v <= 1.0) and np.all(v[2:] >= 0.0)


# weights and the fixed router ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan"), True, "1"])
def test_expert_weights_are_in_the_unit_interval(bad: object) -> None:
    """A weight outside [0, 1], NaN, a bool or a string is refused."""
    with pytest.raises(InvalidInput):
        ExpertWeights(episodic=bad)  # type: ignore[arg-type]


def test_expert_weights_by_kind() -> None:
    """of(kind) gives each expert's weight; an unknown kind is refused."""
    w = ExpertWeights(0.1, 0.2, 0.3)
    assert [w.of(k) for k in ("semantic", "episodic", "visual")] == [0.1, 0.2, 0.3]
    assert w.to_json() == {"semantic": 0.1, "episodic": 0.2, "visual": 0.3}
    with pytest.raises(InvalidInput):
        w.of("procedural")


def test_fixed_router_is_constant() -> None:
    """FixedRouter returns its weights (default 1, 1, 1) whatever the features."""
    assert FixedRouter().route(RouterFeatures()) == ExpertWeights(1.0, 1.0, 1.0)
    r = FixedRouter(visual=0.0)
    assert r.route(RouterFeatures(0.9, 0.9, 5, 5, 1.0, 3)) == r.route(RouterFeatures()) == ExpertWeights(1, 1, 0)
    with pytest.raises(InvalidInput):
        FixedRouter(semantic=2.0)


# labels and fitting ----------------------------------------------------------------------------


def test_label_example_judges_each_experts_top_candidate() -> None:
    """Each expert is labelled by its heaviest candidate's token F1 >= threshold; absent ones not at all."""
    cands = [
        cand("E-1", "episodic", "small right pleural effusion", 0.9),
        cand("E-2", "episodic", "no acute abnormality", 0.4),
        cand("V-1", "visual", "no acute abnormality", 0.95),
    ]
    ex = label_example(RouterFeatures(), cands, "Small right pleural effusion.")
    assert dict(ex.labels) == {"episodic": True, "visual": False}
    strict = label_example(
        RouterFeatures(),
        [cand("E-1", "episodic", "right pleural effusion", 1.0)],
        "small right pleural effusion",
        threshold=0.95,
    )
    assert dict(strict.labels) == {"episodic": False}  # F1 = 6/7 < 0.95


@pytest.mark.parametrize("ids", [("E-a", "E-z"), ("E-z", "E-a")])
def test_label_example_judges_the_first_of_equal_candidates(ids: tuple[str, str]) -> None:
    """Of an expert's candidates equal in weight and time, the one retrieval listed first is
    judged, whatever the random ids."""
    cands = [
        cand(ids[0], "episodic", "small right pleural effusion", 0.9, 5.0),
        cand(ids[1], "episodic", "no acute abnormality", 0.9, 5.0),
    ]
    assert dict(label_example(RouterFeatures(), cands, "Small right pleural effusion.").labels) == {"episodic": True}


def _examples(n: int = 60) -> list[RouterExample]:
    """Episodic is right when its top cosine is high, visual never, semantic always; deterministic."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(n):
        cos = float(rng.uniform(0.0, 1.0))
        f = RouterFeatures(cos, float(rng.uniform(0.0, 1.0)), 3, 3, float(rng.uniform(0, 100)), 2)
        out.append(RouterExample(f, {"episodic": cos > 0.5, "visual": False, "semantic": True}))
    return out


def test_fit_router_learns_which_expert_to_trust() -> None:
    """The learned weights follow the labels: episodic up with cosine, visual low, semantic high."""
    router = fit_router(_examples())
    high, low = RouterFeatures(0.95, 0.5, 3, 3, 10.0, 2), RouterFeatures(0.05, 0.5, 3, 3, 10.0, 2)
    assert router.route(high).episodic > 0.7 > 0.3 > router.route(low).episodic
    assert router.route(high).visual < 0.2
    assert router.route(high).semantic > 0.8
    assert router.examples == {"semantic": 60, "episodic": 60, "visual": 60}


def test_fit_router_is_deterministic_and_finite_on_one_class_labels() -> None:
    """The same examples give the same router bit for bit; all-equal labels keep finite coefficients."""
    a, b = fit_router(_examples()), fit_router(_examples())
    assert json.dumps(a.to_json()) == json.dumps(b.to_json())
    assert all(np.isfinite(a.coef[e]).all() and np.isfinite(a.bias[e]) for e in a.coef)


def test_untrained_expert_keeps_weight_one_and_min_weight_switches_off() -> None:
    """An expert with no examples has weight 1; weights under min_weight become 0."""
    examples = [RouterExample(RouterFeatures(0.9, None, 1, 0, 1.0, 0), {"episodic": False}) for _ in range(20)]
    router = fit_router(examples, min_weight=0.4)
    w = router.route(RouterFeatures(0.9, None, 1, 0, 1.0, 0))
    assert w.semantic == 1.0 and w.visual == 1.0
    assert w.episodic == 0.0
    assert router.weight("episodic", RouterFeatures(0.9, None, 1, 0, 1.0, 0)) < 0.4


@pytest.mark.parametrize("kwargs", [{"l2": 0.0}, {"l2": float("nan")}, {"iterations": 0}, {"min_weight": 1.5}])
def test_fit_router_validates_its_arguments(kwargs: dict[str, float]) -> None:
    """A non-positive penalty, no iterations or a min_weight outside [0, 1] is refused."""
    with pytest.raises(InvalidInput):
        fit_router(_examples(4), **kwargs)  # type: ignore[arg-type]


# persistence -----------------------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    """A saved router loads back with identical coefficients and identical routing."""
    router = fit_router(_examples(), min_weight=0.1)
    router.save(tmp_path / "router.json")
    back = LearnedRouter.load(tmp_path / "router.json")
    assert back.to_json() == router.to_json()
    f = RouterFeatures(0.7, 0.2, 4, 1, 3.0, 1)
    assert back.route(f) == router.route(f)
    assert not list(tmp_path.glob("*.tmp"))


def _corrupt(doc: dict[str, object], how: str) -> object:
    experts = doc["experts"]
    assert isinstance(experts, dict)
    if how == "format":
        doc["format"] = "something-else"
    elif how == "features":
        doc["features"] = list(reversed(FEATURE_NAMES))
    elif how == "expert-missing":
        del experts["visual"]
    elif how == "coef-length":
        experts["episodic"]["coef"] = [0.0]
    elif how == "coef-nan":
        experts["episodic"]["coef"][0] = float("nan")
    elif how == "bias-text":
        experts["semantic"]["bias"] = "0"
    elif how == "examples-negative":
        experts["semantic"]["examples"] = -1
    elif how == "min-weight":
        doc["min_weight"] = 2
    elif how == "extra-key":
        experts["visual"]["scale"] = 1.0
    elif how == "not-object":
        return [1, 2, 3]
    return doc


@pytest.mark.parametrize(
    "how",
    [
        "format",
        "features",
        "expert-missing",
        "coef-length",
        "coef-nan",
        "bias-text",
        "examples-negative",
        "min-weight",
        "extra-key",
        "not-object",
    ],
)
def test_load_rejects_malformed_documents(tmp_path: Path, how: str) -> None:
    """Every malformed router file raises InvalidInput naming the file."""
    doc = fit_router(_examples(10)).to_json()
    path = tmp_path / "router.json"
    path.write_text(json.dumps(_corrupt(doc, how)), encoding="utf-8")
    with pytest.raises(InvalidInput, match="router.json"):
        LearnedRouter.load(path)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe"])
def test_load_rejects_unreadable_files(tmp_path: Path, content: bytes) -> None:
    """Invalid JSON, bad UTF-8 or a missing file raise InvalidInput naming the file."""
    path = tmp_path / "router.json"
    path.write_bytes(content)
    with pytest.raises(InvalidInput, match="router.json"):
        LearnedRouter.load(path)
    with pytest.raises(InvalidInput, match="absent.json"):
        LearnedRouter.load(tmp_path / "absent.json")
