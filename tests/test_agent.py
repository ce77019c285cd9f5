"""The online loop end to end: answers from memory, policy steps as audited reads, router
weights, ablation flags as hard overrides, ask_many (its failures: test_agent_failures.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from msm_mem import InvalidInput
from msm_mem._agent.agent import AgentAnswer
from msm_mem._agent.policy import BackbonePolicy, Step
from msm_mem._agent.router import ROUTER_FILE, FixedRouter, LearnedRouter, RouterExample, RouterFeatures, fit_router
from msm_mem.datasets.manifest import ManifestRow
from msm_mem.datasets.synthetic import generate
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.plugins.backbones.nonparametric import EMPTY_ANSWER
from tests.agent_support import (
    Always,
    Recording,
    agent,
    audit_since,
    by_patient,
    counts,
    later,
    open_store,
    query,
)
from tests.conftest import MemFactory
from tests.helpers import AGENT
from tests.layers import Layers


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> list[ManifestRow]:
    """Eight synthetic patients (generated once per module)."""
    rows, problems = generate(tmp_path_factory.mktemp("synthetic"), patients=8, seed=0)
    assert not problems
    return rows


@pytest.fixture
def layers(new_mem: MemFactory, synthetic: list[ManifestRow]) -> Iterator[Layers]:
    """The layers of a store holding each patient's first study (the agent under test among them)."""
    with open_store(new_mem, synthetic) as m:
        yield m


# answers -----------------------------------------------------------------------------------------


def test_semantic_memory_recovers_the_patients_earlier_finding(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """With semantic memory only, each later study is answered with the patient's earlier impression."""
    firsts = {p: rs[0] for p, rs in by_patient(synthetic).items()}
    assert len({r.answer for r in firsts.values()}) > 1  # the check is patient-specific
    asked = later(synthetic)
    assert len(asked) >= 5
    for row in asked:
        a = layers.agent.ask(AGENT, query(row), use_epi=False, use_vis=False, write_back=False)
        assert a.answer == firsts[row.patient_id].answer, row.patient_id
        assert a.source == "memory"
        assert {e.kind for e in a.evidence} == {"semantic", "claim"}  # claims are read with semantic memory
        assert [s.step for s in a.steps] == [Step("semantic")]


def test_without_any_memory_there_is_no_patient_evidence(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """All flags off: nothing is read, no evidence, and the answer says there is no prior evidence."""
    row = later(synthetic)[0]
    seq, _ = layers.store.audit_head()
    a = layers.agent.ask(AGENT, query(row), use_sem=False, use_epi=False, use_vis=False, write_back=False)
    assert (a.answer, a.source, a.evidence, a.steps) == (EMPTY_ANSWER, "empty", (), ())
    assert not [e for e in audit_since(layers, seq) if e["action"] == "read"]


def test_a_patient_without_memory_gets_the_population_prior(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """A new patient has no evidence; the heuristic widens episodic to the population and the
    backbone answers from other patients' impressions, every one listed as population evidence."""
    row = later(synthetic)[0]
    a = layers.agent.ask(AGENT, query(row, patient="NEW-PATIENT"), write_back=False)
    assert a.evidence and {e.kind for e in a.evidence} == {"population-episodic"}
    assert {e.id for e in a.evidence} == set(a.steps[-1].new_ids)
    assert a.source == "population-prior"
    assert a.answer in {rs[0].answer for rs in by_patient(synthetic).values()}
    assert a.steps[-1].step == Step("episodic", "population") and a.steps[-1].count > 0


def test_full_memory_reads_s_e_v_and_cites_only_the_patients_records(
    layers: Layers, synthetic: list[ManifestRow]
) -> None:
    """Default ask: the heuristic reads S, E, V in patient scope; the evidence is the patient's own."""
    for row in later(synthetic)[:3]:
        a = layers.agent.ask(AGENT, query(row), write_back=False)
        assert [s.step for s in a.steps] == [Step("semantic"), Step("episodic"), Step("visual")]
        assert {e.kind for e in a.evidence} == {"semantic", "episodic", "visual", "claim"}
        ids = [e.id for e in a.evidence if e.kind == "episodic"]
        claims = [e.id for e in a.evidence if e.kind == "claim"]
        assert {c.patient_id for c in layers.store.get_claims(claims)} == {row.patient_id}
        assert {r.patient_id for r in layers.store.get_episodes(ids)} == {row.patient_id}
        assert [e.score for e in a.evidence] == sorted((e.score for e in a.evidence), reverse=True)


# policy and flags --------------------------------------------------------------------------------


def test_every_step_is_one_audited_read(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """One read event per executed step, carrying the ids that step returned."""
    seq, _ = layers.store.audit_head()
    a = layers.agent.ask(AGENT, query(later(synthetic)[0]), write_back=False)
    reads = [e for e in audit_since(layers, seq) if e["action"] == "read"]
    assert len(reads) == len(a.steps) == 3
    for event, step in zip(reads, a.steps, strict=True):
        assert event["record_ids"] == [h.id for h, _ in step.hits]


def test_flags_override_the_policy(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """A policy asking for a switched-off memory is refused every time: nothing read, limit enforced."""
    seq, _ = layers.store.audit_head()
    a = agent(layers, policy=Always(Step("visual", "population")), max_steps=3).ask(
        AGENT, query(later(synthetic)[0]), use_vis=False, write_back=False
    )
    assert [s.refused for s in a.steps] == [True, True, True]
    assert not [e for e in audit_since(layers, seq) if e["action"] == "read"]
    assert a.weights is not None and a.weights.visual == 0.0


class Replies:
    """A backbone that replies with scripted texts (for the backbone policy)."""

    name = "replies"

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    def generate(self, request: BackboneRequest) -> BackboneReply:
        return BackboneReply(self.texts.pop(0))


def test_a_backbone_policy_drives_the_reads(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """The backbone policy's steps are read as told; an unparsable reply stops the loop."""
    row = later(synthetic)[0]
    seq, _ = layers.store.audit_head()
    a = agent(layers, policy=BackbonePolicy(Replies("episodic patient 1", "sure, let me think"))).ask(
        AGENT, query(row), write_back=False
    )
    assert [s.step for s in a.steps] == [Step("episodic", "patient", 1)]
    assert len([e for e in audit_since(layers, seq) if e["action"] == "read"]) == 1
    assert [e.kind for e in a.evidence] == ["episodic"]
    assert a.answer == by_patient(synthetic)[row.patient_id][0].answer


def test_step_limit_bounds_a_policy_that_never_stops(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """max_steps reads at most; repeated hits are deduplicated by id."""
    a = agent(layers, policy=Always(Step("episodic", "population", 3)), max_steps=2).ask(
        AGENT, query(later(synthetic)[0]), write_back=False
    )
    assert len(a.steps) == 2
    assert a.steps[0].new_ids and a.steps[1].new_ids == ()
    assert len({e.id for e in a.evidence}) == len(a.evidence)


def test_step_k_keeps_the_best_hits(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """k=1 keeps only the top hit of a population read."""
    a = agent(layers, policy=Always(Step("episodic", "population", 1)), max_steps=1).ask(
        AGENT, query(later(synthetic)[0]), write_back=False
    )
    assert a.steps[0].count == 1


def test_a_policy_returning_garbage_fails_the_turn(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """A policy answer that is neither a Step nor None is an error, audited, nothing written."""
    before = counts(layers)
    with pytest.raises(InvalidInput, match="policy"):
        agent(layers, policy=Always("episodic patient"), max_steps=1).ask(AGENT, query(later(synthetic)[0]))  # type: ignore[arg-type]
    assert counts(layers) == before


@pytest.mark.parametrize("steps", [0, -1, True])
def test_max_steps_must_be_positive(layers: Layers, steps: int) -> None:
    """max_steps below 1 (or a bool) is refused."""
    with pytest.raises(InvalidInput):
        agent(layers, max_steps=steps)


# router ------------------------------------------------------------------------------------------


def test_router_weights_scale_candidates_and_zero_switches_an_expert_off(
    layers: Layers, synthetic: list[ManifestRow]
) -> None:
    """Weights multiply each expert's candidate weights; weight 0 drops its candidates, prompt lines and evidence."""
    row = later(synthetic)[0]
    bb = Recording()
    a = agent(layers, backbone=bb, router=FixedRouter(semantic=1.0, episodic=0.5, visual=0.0)).ask(
        AGENT, query(row), write_back=False
    )
    sent = bb.requests[-1].candidates
    assert {c.kind for c in sent} == {"semantic", "episodic", "claim"}  # claims go with the semantic expert
    raw = {c.id: c.weight for c in a.candidates}
    for c in sent:
        assert c.weight == pytest.approx(raw[c.id] * (0.5 if c.kind == "episodic" else 1.0))
    assert "visual" not in {e.kind for e in a.evidence}
    visual_ids = [h.id for s in a.steps if s.step.memory == "visual" for h, _ in s.hits]
    assert visual_ids and not any(v in a.prompt for v in visual_ids)
    assert bb.requests[-1].options["expert_weights"] == {"semantic": 1.0, "episodic": 0.5, "visual": 0.0}


def test_all_experts_off_means_no_evidence(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """A router switching every expert off leaves the backbone with nothing: 'No prior evidence'."""
    a = agent(layers, router=FixedRouter(0.0, 0.0, 0.0)).ask(AGENT, query(later(synthetic)[0]), write_back=False)
    assert (a.answer, a.evidence) == (EMPTY_ANSWER, ())


def test_router_features_describe_the_patients_retrieval(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """The router sees the top cosines, counts, evidence age and semantic history of the patient."""
    row = later(synthetic)[0]
    a = layers.agent.ask(AGENT, query(row), write_back=False)
    f = a.features
    assert f is not None
    assert (f.n_episodic, f.n_visual, f.semantic_len) == (1, 1, 1)
    first = by_patient(synthetic)[row.patient_id][0]
    assert f.newest_age_days == pytest.approx((row.timestamp - first.timestamp) / 86_400)
    assert f.top_cosine_episodic is not None and 0.0 < f.top_cosine_episodic <= 1.0


def test_a_learned_router_in_the_store_directory_is_used(new_mem: MemFactory, synthetic: list[ManifestRow]) -> None:
    """router.json in the store directory is loaded by a new agent; a malformed one is an error."""
    examples = [RouterExample(RouterFeatures(0.9, 0.9, 1, 1, 1.0, 1), {"visual": False}) for _ in range(10)]
    learned = fit_router(examples, min_weight=0.5)
    with open_store(new_mem, synthetic) as m:
        assert isinstance(m.agent.router, FixedRouter)
        path = m.agent.install_router(learned)
        assert path == m.directory / ROUTER_FILE and path.is_file()
        fresh = agent(m)
        assert isinstance(fresh.router, LearnedRouter) and fresh.router.to_json() == learned.to_json()
        a = fresh.ask(AGENT, query(later(synthetic)[0]), write_back=False)
        assert a.weights is not None and a.weights.visual == 0.0
        assert "visual" not in {e.kind for e in a.evidence}
        path.write_text("{}", encoding="utf-8")
        with pytest.raises(InvalidInput, match=ROUTER_FILE):
            agent(m)


# ask_many ----------------------------------------------------------------------------------------


def _summary(answers: Sequence[AgentAnswer]) -> list[tuple[Any, ...]]:
    """Everything but the random record ids."""
    return [
        (a.answer, a.source, a.decision, a.gate, tuple((e.kind, round(e.score, 9)) for e in a.evidence))
        for a in answers
    ]


def test_ask_many_equals_asking_one_at_a_time(new_mem: MemFactory, synthetic: list[ManifestRow]) -> None:
    """ask_many gives the answers of sequential asks, write-backs included (two identical stores)."""
    rows = sorted((r for rs in by_patient(synthetic).values() for r in rs[1:]), key=lambda r: r.timestamp)
    queries = [query(r) for r in rows]
    with open_store(new_mem, synthetic, "a") as a, open_store(new_mem, synthetic, "b") as b:
        many = a.agent.ask_many(AGENT, queries)
        one = [b.agent.ask(AGENT, q) for q in queries]
        assert _summary(many) == _summary(one)
        assert counts(a) == counts(b)
        assert any(x.gate is not None and x.gate.written for x in many)


def test_ask_many_without_write_back_is_identical_in_one_store(layers: Layers, synthetic: list[ManifestRow]) -> None:
    """Without write-back, ask_many and sequential asks return identical JSON, ids included."""
    queries = [query(r) for r in later(synthetic)]
    many = layers.agent.ask_many(AGENT, queries, use_vis=False, write_back=False)
    one = [layers.agent.ask(AGENT, q, use_vis=False, write_back=False) for q in queries]
    assert [x.to_json() for x in many] == [x.to_json() for x in one]


def test_the_question_asked_is_what_is_answered(new_mem: MemFactory, tmp_path: Any) -> None:
    """A patient's studies answer two questions each (a finding and "in the ICU?"): a new study's
    "What is the diagnosis?" gets the finding, never "yes", and "in the ICU?" gets the newest
    verified outcome, not the one most older answers give."""
    from tests.helpers import SYSTEM, png

    mem = new_mem()
    rows = []
    for i, icu in enumerate(["yes", "yes", "yes", "no"]):
        image = str(png(tmp_path, i))
        when = 1_600_000_000.0 + i * 86_400
        rows.append(ManifestRow("P1", f"S{i}", when, image, "What is the diagnosis?", "COVID-19"))
        rows.append(ManifestRow("P1", f"S{i}", when, image, "Is the patient in the ICU?", icu))
    mem.ingest(SYSTEM, rows)
    new = str(png(tmp_path, 9))
    diagnosis = mem.ask(AGENT, "P1", new, "What is the diagnosis?", timestamp=1_600_000_000.0 + 9 * 86_400)
    assert diagnosis.answer == "COVID-19"
    icu = mem.ask(AGENT, "P1", new, "is the patient in the ICU", timestamp=1_600_000_000.0 + 9 * 86_400)
    assert icu.answer == "no"
