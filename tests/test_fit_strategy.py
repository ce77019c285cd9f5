"""Each fitted group's strategy: the router, the patient's newest evidence, the nearest evidence,
the vote or the model, chosen on the fine-tune patients only and read back by the backbone."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from msm_mem import InvalidInput
from msm_mem.datasets.manifest import ManifestRow
from msm_mem.datasets.synthetic import generate
from msm_mem.eval.fit_select import Example, select_strategy
from msm_mem.eval.metrics import exact_match
from msm_mem.eval.protocol import ProtocolSettings, run_protocol
from msm_mem.plugins.backbones.base import BackboneRequest, Candidate
from msm_mem.plugins.backbones.fitted import FittedBackbone, answer_with
from msm_mem.plugins.backbones.fitted_format import STRATEGIES, FittedGroup, FittedModels, load
from msm_mem.plugins.encoders import get_encoder

pytestmark = pytest.mark.slow

Q = "What is the diagnosis?"
DAY = 86_400.0
DIM = get_encoder("pixels").dim


def _c(id: str, kind: str, text: str, weight: float, day: float) -> Candidate:
    return Candidate(id, kind, text, "", weight, 1e9 + day * DAY, 1.0)


REQUEST = BackboneRequest(
    "",
    Q,
    candidates=(
        _c("e1", "episodic", "Pneumonia", 0.9, 1),
        _c("v1", "visual", "Pneumonia", 0.5, 1),
        _c("s1", "semantic", "COVID-19", 0.3, 5),
    ),
    prior=(_c("p1", "episodic", "ARDS", 0.95, 3),),
)
MODEL = ("Normal", 0.7)


@pytest.mark.parametrize(
    ("strategy", "answer", "source"),
    [
        ("newest", "COVID-19", "memory"),
        ("nearest", "ARDS", "population-prior"),
        ("vote", "Pneumonia", "memory"),
        ("model", "Normal", "model"),
    ],
)
def test_each_strategy_reads_the_request_as_its_baseline_does(strategy: str, answer: str, source: str) -> None:
    """newest: the patient's newest own evidence; nearest: the best-ranked evidence of anyone;
    vote: the untrained vote; model: the memory-free model."""
    reply = answer_with(strategy, REQUEST, MODEL, None)
    assert (reply.answer, reply.source) == (answer, source)


def test_strategies_fall_back_when_they_have_nothing() -> None:
    """Without own evidence newest votes over the population; with no evidence at all newest,
    nearest and vote answer with the model; an unknown strategy is refused."""
    population_only = replace(REQUEST, candidates=())
    assert answer_with("newest", population_only, MODEL, None).answer == "ARDS"
    empty = BackboneRequest("", Q)
    for s in ("newest", "nearest", "vote", "model"):
        assert answer_with(s, empty, MODEL, None).answer == "Normal"
    assert answer_with("router", empty, MODEL, None).answer == "Normal"
    with pytest.raises(InvalidInput, match="unknown strategy"):
        answer_with("oracle", REQUEST, MODEL, None)


def _group(strategy: str = "router") -> FittedGroup:
    return FittedGroup("label", Q, ("Normal", "COVID-19"), np.zeros((2, DIM)), np.zeros(2), strategy=strategy)


def test_the_strategy_round_trips_and_is_validated(tmp_path: Path) -> None:
    """The file keeps each group's strategy; a file without one follows the router; a strategy
    that is not one of STRATEGIES is InvalidInput."""
    path = tmp_path / "f.npz"
    FittedModels("pixels", DIM, (_group("newest"),)).save(path)
    assert load(path).groups[0].strategy == "newest"
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes())
    for value, expect in ((None, "router"), ("oracle", None)):
        if value is None:
            del meta["groups"][0]["strategy"]
        else:
            meta["groups"][0]["strategy"] = value
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(path, **arrays)
        if expect is None:
            with pytest.raises(InvalidInput, match="strategy must be one of"):
                load(path)
        else:
            assert load(path).groups[0].strategy == expect


def test_the_backbone_answers_by_its_groups_strategy(tmp_path: Path) -> None:
    """The same request gets the newest evidence from a 'newest' group, the vote from a 'vote' one."""
    answers = {}
    for s in ("newest", "vote"):
        FittedModels("pixels", DIM, (_group(s),)).save(tmp_path / f"{s}.npz")
        answers[s] = FittedBackbone(tmp_path / f"{s}.npz").generate(REQUEST).answer
    assert answers == {"newest": "COVID-19", "vote": "Pneumonia"}


def _examples(n: int, *, right: str) -> list[Example]:
    """``n`` patients whose newest own evidence says ``right`` (the reference) while two older,
    better-ranked memories say something else."""
    out = []
    for i in range(n):
        row = ManifestRow(f"p{i:02d}", f"p{i:02d}-2", 1e9 + 9 * DAY, "/x.png", Q, right)
        request = BackboneRequest(
            "",
            Q,
            candidates=(
                _c(f"e{i}", "episodic", "Pneumonia", 0.9, 1),
                _c(f"v{i}", "visual", "Pneumonia", 0.8, 1),
                _c(f"s{i}", "semantic", right, 0.2, 5),
            ),
        )
        out.append(Example(row, request, None))
    return out


def test_selection_picks_what_the_fine_tune_patients_show_is_right() -> None:
    """When only the patient's newest evidence is right, the cross-validation picks 'newest'
    (the router, all but unpenalised here, follows the majority of experts); when every strategy
    scores alike it keeps the router; with one patient there is nothing to hold out."""
    chosen, means = select_strategy(_examples(10, right="COVID-19"), exact_match, folds=5, router_c=1e-6)
    assert chosen == "newest" and means["newest"] == 1.0
    assert set(means) == set(STRATEGIES) and all(means[s] < 1.0 for s in STRATEGIES if s != "newest")
    chosen, means = select_strategy(_examples(10, right="Pneumonia"), exact_match, folds=5, router_c=1e-6)
    assert chosen == "router" and set(means.values()) == {1.0}
    assert select_strategy(_examples(1, right="COVID-19"), exact_match, folds=5, router_c=1.0) == ("router", {})


def test_validation_answers_never_change_the_strategy(tmp_path: Path) -> None:
    """Changing every validation answer leaves each group's strategy and every strategy's
    cross-validated score the same; changing fine-tune answers changes the scores."""
    rows, _ = generate(tmp_path / "syn", patients=30, studies_per_patient=(2, 3), seed=5, size=64)
    settings = ProtocolSettings(configs=(), baselines=(), fit=True)
    first = run_protocol(rows, settings)
    assert first.fitted is not None
    split = first.split

    def rerun(patients: set[str]) -> tuple[list[str], object]:
        changed = [replace(r, answer="Changed answer.") if r.patient_id in patients else r for r in rows]
        run = run_protocol(changed, settings)
        assert run.split == split and run.fitted is not None
        return [g.strategy for g in run.fitted.groups], run.fitted.fit["strategy_cv"]

    original = ([g.strategy for g in first.fitted.groups], first.fitted.fit["strategy_cv"])
    assert original[1] and all(set(v) == set(STRATEGIES) for v in original[1].values())
    assert rerun(set(split.validation)) == original
    assert rerun(set(sorted(split.finetune)[: len(split.finetune) // 2]))[1] != original[1]
