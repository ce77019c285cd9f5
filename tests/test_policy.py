"""The retrieval policy: steps, the textual protocol, the heuristic rules, the backbone policy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from msm_mem import BackendError, InvalidInput
from msm_mem._agent.policy import (
    MEMORIES,
    BackbonePolicy,
    HeuristicPolicy,
    PolicyQuery,
    RetrievalPolicy,
    RetrievalStep,
    Step,
    parse_step,
)
from msm_mem._memory.ranking import Score
from msm_mem._records import EpisodicRecord, Hit, VisualRecord
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest

Z = np.ones(4, dtype=np.float32) / 2.0
QUESTION = "What is the impression of this chest radiograph?"


def hit(i: str, cos: float, kind: str = "episodic", patient: str = "p1") -> tuple[Hit, Score]:
    rec: EpisodicRecord | VisualRecord
    if kind == "episodic":
        rec = EpisodicRecord(i, patient, 0.0, Z, QUESTION, "effusion")
    else:
        rec = VisualRecord(i, patient, 0.0, Z)
    return Hit(i, kind, cos, rec), Score(cos, 1.0, 1.0, 1.0)  # type: ignore[arg-type]


def done(step: Step, *hits: tuple[Hit, Score]) -> RetrievalStep:
    return RetrievalStep(step, tuple(hits), tuple(h.id for h, _ in hits))


class Scripted:
    """A fake backbone replying with scripted texts and recording its requests."""

    name = "scripted"

    def __init__(self, *replies: object) -> None:
        self.replies = list(replies)
        self.requests: list[BackboneRequest] = []

    def generate(self, request: BackboneRequest) -> BackboneReply:
        self.requests.append(request)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return BackboneReply(str(reply))


# steps and the textual protocol ----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"memory": "procedural"},
        {"memory": "episodic", "scope": "world"},
        {"memory": "episodic", "k": 0},
        {"memory": "episodic", "k": 101},
        {"memory": "episodic", "k": True},
        {"memory": "episodic", "k": 2.0},
        {"memory": "semantic", "scope": "population"},
        {"memory": "semantic", "k": 3},
    ],
)
def test_step_rejects_invalid_pairs(kwargs: dict[str, object]) -> None:
    """Unknown memories or scopes, k outside [1, 100] and non-patient semantic steps are refused."""
    with pytest.raises(InvalidInput):
        Step(**kwargs)  # type: ignore[arg-type]


def test_every_step_round_trips_through_its_text() -> None:
    """parse_step(step.text()) == step for every memory, scope and a few k."""
    for memory, scope, k in itertools.product(MEMORIES, ("patient", "population", "anonymous"), (None, 1, 7, 100)):
        try:
            step = Step(memory, scope, k)  # type: ignore[arg-type]
        except InvalidInput:
            continue
        assert parse_step(step.text()) == step


@pytest.mark.parametrize("text", ["STOP", "stop", "  Stop \n"])
def test_parse_step_reads_stop(text: str) -> None:
    """STOP in any case, with surrounding whitespace, means stop (None)."""
    assert parse_step(text) is None


def test_parse_step_ignores_case_and_runs_of_spaces() -> None:
    """'Episodic   PATIENT  5' is the step episodic/patient/5."""
    assert parse_step("Episodic   PATIENT  5") == Step("episodic", "patient", 5)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "episodic",
        "episodic patient 5 please",
        "I think: episodic patient 5",
        "episodic\npatient 5",
        "episodic patient 0",
        "episodic patient 1000",
        "episodic patient -1",
        "semantic population",
        "semantic patient 5",
        "STOP now",
        "procedural patient",
        "episodic everyone",
    ],
)
def test_parse_step_is_strict(text: str) -> None:
    """Anything but exactly one step or STOP raises InvalidInput (never a guess)."""
    with pytest.raises(InvalidInput):
        parse_step(text)


# the heuristic ---------------------------------------------------------------------------------


def run(policy: RetrievalPolicy, query: PolicyQuery, results: dict[Step, list[tuple[Hit, Score]]]) -> list[Step]:
    """Drive a policy to STOP (at most 10 steps) with canned results per step."""
    history: list[RetrievalStep] = []
    for _ in range(10):
        step = policy.next(query, history)
        if step is None:
            return [h.step for h in history]
        history.append(done(step, *results.get(step, [])))
    raise AssertionError("the policy did not stop")


def test_heuristic_reads_s_e_v_in_patient_scope_then_stops_on_strong_evidence() -> None:
    """With similar patient evidence the heuristic reads S, E, V (patient scope) and stops."""
    results = {Step("episodic"): [hit("E-1", 0.9)], Step("visual"): [hit("V-1", 0.8, "visual")]}
    assert run(HeuristicPolicy(), PolicyQuery(QUESTION), results) == [
        Step("semantic"),
        Step("episodic"),
        Step("visual"),
    ]


def test_heuristic_widens_episodic_to_the_population_without_patient_hits() -> None:
    """No patient episodic/visual hits: one population episodic step, then STOP."""
    steps = run(HeuristicPolicy(), PolicyQuery(QUESTION), {})
    assert steps == [Step("semantic"), Step("episodic"), Step("visual"), Step("episodic", "population")]


def test_heuristic_widens_when_the_best_cosine_is_low() -> None:
    """Patient hits below min_cosine trigger the population step; at the threshold they do not."""
    low = {Step("episodic"): [hit("E-1", 0.29)], Step("visual"): [hit("V-1", 0.1, "visual")]}
    assert run(HeuristicPolicy(min_cosine=0.3), PolicyQuery(QUESTION), low)[-1] == Step("episodic", "population")
    at = {Step("episodic"): [hit("E-1", 0.3)]}
    assert run(HeuristicPolicy(min_cosine=0.3), PolicyQuery(QUESTION), at)[-1] == Step("visual")


def test_heuristic_widens_when_hits_are_few() -> None:
    """Fewer than min_hits patient hits (E + V) trigger the population step."""
    two = {Step("episodic"): [hit("E-1", 0.9)], Step("visual"): [hit("V-1", 0.9, "visual")]}
    assert run(HeuristicPolicy(min_hits=3), PolicyQuery(QUESTION), two)[-1] == Step("episodic", "population")
    assert run(HeuristicPolicy(min_hits=2), PolicyQuery(QUESTION), two)[-1] == Step("visual")


def test_heuristic_respects_the_allowed_memories() -> None:
    """Only allowed memories are proposed; without episodic memory there is no population step."""
    only_visual = PolicyQuery(QUESTION, frozenset({"visual"}))
    assert run(HeuristicPolicy(), only_visual, {}) == [Step("visual")]
    sem_epi = PolicyQuery(QUESTION, frozenset({"semantic", "episodic"}))
    assert run(HeuristicPolicy(), sem_epi, {}) == [Step("semantic"), Step("episodic"), Step("episodic", "population")]
    assert run(HeuristicPolicy(), PolicyQuery(QUESTION, frozenset()), {}) == []


@pytest.mark.parametrize("kwargs", [{"min_cosine": 1.5}, {"min_cosine": -2.0}, {"min_hits": -1}, {"min_hits": 1.5}])
def test_heuristic_thresholds_are_validated(kwargs: dict[str, float]) -> None:
    """A cosine threshold outside [-1, 1] or a negative / non-integer hit count is refused."""
    with pytest.raises(InvalidInput):
        HeuristicPolicy(**kwargs)  # type: ignore[arg-type]


def test_retrieval_step_summary() -> None:
    """count and top_cosine summarise a step; semantic-only or refused steps have no cosine."""
    s = done(Step("episodic"), hit("E-1", 0.4), hit("E-2", 0.7))
    assert (s.count, s.top_cosine) == (2, 0.7)
    assert RetrievalStep(Step("visual"), refused=True).top_cosine is None


# the backbone policy ---------------------------------------------------------------------------


def test_backbone_policy_follows_parsable_replies_then_stop() -> None:
    """Each reply becomes a step; STOP ends; the prompt lists allowed memories and the history."""
    bb = Scripted("episodic patient 5", "visual population 3", "STOP")
    policy = BackbonePolicy(bb)
    steps = run(
        policy,
        PolicyQuery(QUESTION, frozenset({"episodic", "visual"})),
        {Step("episodic", "patient", 5): [hit("E-1", 0.91)]},
    )
    assert steps == [Step("episodic", "patient", 5), Step("visual", "population", 3)]
    assert "Allowed memories: episodic, visual" in bb.requests[0].prompt
    assert "(none)" in bb.requests[0].prompt
    assert "1. episodic patient 5 -> 1 hits, 1 new, top cosine 0.910" in bb.requests[1].prompt
    assert all(r.question == QUESTION for r in bb.requests)
    assert policy.last_error == ""


@pytest.mark.parametrize("reply", ["Let me look at episodic memory.", "episodic patient 5\nSTOP", ""])
def test_backbone_policy_stops_on_an_unparsable_reply(reply: str) -> None:
    """An unparsable reply is STOP (None), with the reason kept in last_error."""
    policy = BackbonePolicy(Scripted(reply))
    assert policy.next(PolicyQuery(QUESTION), []) is None
    assert policy.last_error


def test_backbone_policy_lets_backend_errors_through() -> None:
    """A backend failure is not a STOP: BackendError propagates to the agent."""
    policy = BackbonePolicy(Scripted(BackendError("timeout")))
    with pytest.raises(BackendError):
        policy.next(PolicyQuery(QUESTION), [])


def test_backbone_policy_wraps_other_backbone_failures() -> None:
    """Any other exception of the policy's backbone becomes a BackendError naming the backbone."""
    policy = BackbonePolicy(Scripted(ConnectionError("reset")))
    with pytest.raises(BackendError, match="scripted.*ConnectionError"):
        policy.next(PolicyQuery(QUESTION), [])


def test_backbone_policy_prompt_reports_refused_steps() -> None:
    """A refused step (memory switched off) is shown as refused in the next prompt."""
    policy = BackbonePolicy(Scripted("STOP"))
    history = [RetrievalStep(Step("semantic"), refused=True)]
    assert "1. semantic patient -> refused" in policy.prompt(PolicyQuery(QUESTION), history)
