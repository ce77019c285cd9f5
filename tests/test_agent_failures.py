"""The online loop's failures change nothing but the audit trail (an unreadable image, an empty
question, a failing backbone); the loop end to end on the real covid-cxr snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import BackendError, ImageError, InvalidInput
from msm_mem._agent.agent import Query
from msm_mem.datasets.manifest import ManifestRow
from msm_mem.datasets.registry import load_dataset
from msm_mem.datasets.synthetic import generate
from msm_mem.plugins.backbones.base import BackboneReply
from tests.agent_support import Faulty, agent, audit_since, by_patient, counts, later, open_store, query
from tests.conftest import MemFactory
from tests.helpers import AGENT
from tests.layers import Layers

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


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


# failures ----------------------------------------------------------------------------------------


def _events(layers: Layers, seq: int) -> list[tuple[str, str]]:
    return [(e["action"], e["outcome"]) for e in audit_since(layers, seq)]


def test_an_unreadable_image_fails_and_writes_only_the_audit(
    layers: Layers, synthetic: list[ManifestRow], tmp_path: Path
) -> None:
    """A corrupt image raises ImageError; memory is unchanged; consent and the error are audited."""
    bad = tmp_path / "corrupt.png"
    bad.write_bytes(b"not a png")
    before, (seq, _) = counts(layers), layers.store.audit_head()
    with pytest.raises(ImageError):
        layers.agent.ask(AGENT, Query(later(synthetic)[0].patient_id, bad, "What is the impression?"))
    assert counts(layers) == before
    events = audit_since(layers, seq)
    assert [(e["action"], e["outcome"]) for e in events] == [("consent", "success"), ("turn", "error")]
    assert events[-1]["reason"] == "ImageError"


@pytest.mark.parametrize("question", ["", "   "])
def test_an_empty_question_fails_before_anything_happens(
    layers: Layers, synthetic: list[ManifestRow], question: str
) -> None:
    """A blank question raises InvalidInput; nothing at all is written, not even an audit event."""
    before, head = counts(layers), layers.store.audit_head()
    with pytest.raises(InvalidInput, match="question"):
        layers.agent.ask(AGENT, Query(later(synthetic)[0].patient_id, later(synthetic)[0].image, question))
    assert (counts(layers), layers.store.audit_head()) == (before, head)


@pytest.mark.parametrize(
    "result",
    [
        BackendError("endpoint timed out"),
        RuntimeError("socket closed"),
        BackboneReply(""),
        BackboneReply(123),
        "just a string",
        None,
    ],  # type: ignore[arg-type]
    ids=["backend-error", "other-exception", "empty-answer", "non-text-answer", "not-a-reply", "none"],
)
def test_a_failing_backbone_changes_nothing_but_the_audit(
    layers: Layers, synthetic: list[ManifestRow], result: object
) -> None:
    """A backbone that raises or replies malformed gives BackendError; memory is unchanged; the
    consent decision, every read and the error are audited."""
    before, (seq, _) = counts(layers), layers.store.audit_head()
    with pytest.raises(BackendError, match="faulty|timed out"):  # the backbone's own error passes unchanged
        agent(layers, backbone=Faulty(result)).ask(AGENT, query(later(synthetic)[0]))
    assert counts(layers) == before
    assert _events(layers, seq) == [("consent", "success")] + [("read", "success")] * 3 + [("turn", "error")]
    assert audit_since(layers, seq)[-1]["reason"] == "BackendError"
    assert layers.audit.verify().ok


# covid-cxr ---------------------------------------------------------------------------------------


@pytest.mark.shared
def test_covid_cxr_end_to_end(new_mem: MemFactory) -> None:
    """On the real covid-cxr snapshot (a handful of patients with distinct first diagnoses): semantic
    memory recovers each patient's earlier diagnosis; full memory cites only that patient."""
    folder = SHARED / "data" / "covid-cxr"
    if not (folder / "metadata.csv").is_file():
        pytest.skip("../shared/data/covid-cxr absent")
    rows, _ = load_dataset("covid-cxr", folder, check_images=False)
    rows = [r for r in rows if r.question_type == "label"]  # one question per study: the finding
    chosen: dict[str, list[ManifestRow]] = {}
    for patient, rs in by_patient(rows).items():
        if len(rs) > 1 and rs[0].answer not in {c[0].answer for c in chosen.values()}:
            chosen[patient] = rs
        if len(chosen) == 5:
            break
    assert len(chosen) >= 3
    with open_store(new_mem, [r for rs in chosen.values() for r in rs]) as m:
        for patient, rs in chosen.items():
            sem = m.agent.ask(AGENT, query(rs[1]), use_epi=False, use_vis=False, write_back=False)
            assert sem.answer == rs[0].answer, patient
            full = m.agent.ask(AGENT, query(rs[1]), write_back=False)
            episodes = m.store.get_episodes([e.id for e in full.evidence if e.kind == "episodic"])
            assert episodes and {e.patient_id for e in episodes} == {patient}
            assert full.answer == rs[0].answer  # the only evidence is the patient's first study
        stranger = m.agent.ask(AGENT, query(next(iter(chosen.values()))[1], patient="covid-nobody"), write_back=False)
        assert stranger.source == "population-prior" and stranger.evidence
        assert {e.kind for e in stranger.evidence} == {"population-episodic"}
        assert stranger.answer in {rs[0].answer for rs in chosen.values()}
