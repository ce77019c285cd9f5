"""The memory core: retrieval, write-back, semantic versions, batch equivalence."""

from __future__ import annotations

import numpy as np
import pytest

from msm_mem import InvalidInput, InvalidVector, Settings
from msm_mem._memory.msm import Interaction, Memory
from msm_mem._memory.retrieval import Retrieval
from msm_mem._records import EpisodicRecord, Hit
from msm_mem._storage.base import Store
from msm_mem.testing import FixedClock
from tests.conftest import DIM, StoreFactory, random_unit

ANSWER = "Right lower lobe consolidation, increased since prior."


def interaction(patient: str, z: np.ndarray, t: float, answer: str = ANSWER, **kw: object) -> Interaction:
    return Interaction(patient, z, "What is the impression?", answer, t, **kw)  # type: ignore[arg-type]


def counts(store: Store) -> tuple[int, int, int]:
    return store.count("episodic"), store.count("visual"), store.count("semantic")


def test_write_back_consolidates_and_versions_semantic(store: Store) -> None:
    """A passing interaction writes one episode, one visual and a first semantic version."""
    mem = Memory(store, clock=FixedClock())
    z = random_unit(np.random.default_rng(0))
    res = mem.write_back(interaction("p1", z, 1e9, decision="treat", visual_tag="PA"))
    assert res.gate.written and res.episode_id and res.visual_id
    ep = store.get_episodes([res.episode_id])[0]
    vis = store.get_visuals([res.visual_id])[0]
    assert vis.source_episode_id == ep.episode_id and vis.visual_tag == "PA"
    assert np.allclose(ep.z, z / np.linalg.norm(z))
    assert res.semantic.version == 1 and res.semantic.impressions[0].decision == "treat"


def test_a_duplicate_image_reaches_no_long_term_memory(store: Store) -> None:
    """The same image twice: the second answer is gated out (not novel) and reaches neither
    episodic, visual nor semantic memory (its semantic version stays the first)."""
    mem = Memory(store)
    z = random_unit(np.random.default_rng(1))
    first = mem.write_back(interaction("p", z, 1e9))
    second = mem.write_back(interaction("p", z, 2e9, answer="Pleural effusion now resolved on the right."))
    assert not second.gate.written and "not_novel" in second.gate.reasons
    assert second.gate.max_cosine == pytest.approx(1.0, abs=1e-5)
    assert second.semantic is None and second.episode_id is None
    assert counts(store) == (1, 1, 1)
    (active,) = mem.semantic.get("p")
    assert first.semantic is not None and active.state_id == first.semantic.state_id
    assert not any(i.text.startswith("Pleural effusion") for i in active.impressions)


def test_semantic_history_is_bounded(store: Store) -> None:
    """Only the last N impressions (by time marker) are kept in the active version."""
    mem = Memory(store, Settings(semantic_history=3))
    rng = np.random.default_rng(2)
    for t in range(6):
        mem.write_back(interaction("p", random_unit(rng), 1e9 + t, answer=f"finding {t} consolidation"))
    active = mem.semantic.get("p")[0]
    assert [i.text for i in active.impressions] == [f"finding {t} consolidation" for t in (3, 4, 5)]
    assert len(store.semantic_history("p", "impression")) == 6


def test_batch_equals_one_at_a_time(make_store: StoreFactory) -> None:
    """write_back_many gives the same gate decisions and semantic history as single calls."""
    rng = np.random.default_rng(3)
    base = [random_unit(rng) for _ in range(5)]
    its = [interaction(f"p{i % 2}", base[i % 3], 1e9 + i) for i in range(8)]
    one, many = Memory(make_store()), Memory(make_store())
    singles = [one.write_back(it) for it in its]
    batch = many.write_back_many(its)
    assert [r.gate for r in singles] == [r.gate for r in batch]
    assert counts(one.store) == counts(many.store)
    for p in ("p0", "p1"):
        a = [s.impressions for s in one.store.semantic_history(p, "impression")]
        b = [s.impressions for s in many.store.semantic_history(p, "impression")]
        assert a == b


@pytest.mark.parametrize("ids", [("E-a", "E-z"), ("E-z", "E-a")])
def test_evidence_of_equal_cosine_lists_the_newer_record_first(ids: tuple[str, str]) -> None:
    """Retrieval.evidence merges E, V and claims by cosine; equal cosines of one kind list the
    newer record first, whatever the random ids."""
    newer, older = ids
    z = random_unit(np.random.default_rng(4))
    hits = tuple(
        Hit(i, "episodic", 0.7, EpisodicRecord(i, "p", t, z, "What is the impression?", ANSWER))
        for i, t in ((older, 1e9), (newer, 2e9))
    )
    ranked = Retrieval((), hits, ()).evidence()
    assert [h.id for h in ranked] == [newer, older]


def test_retrieval_is_patient_scoped_and_ablatable(store: Store) -> None:
    """Patient scope never returns another patient's items; flags switch memories off."""
    mem = Memory(store)
    rng = np.random.default_rng(4)
    z = random_unit(rng)
    mem.write_back(interaction("a", z, 1e9))
    mem.write_back(interaction("b", z, 1e9))
    r = mem.retrieve("a", z)
    assert {h.record.patient_id for h in (*r.episodic, *r.visual)} == {"a"}  # type: ignore[union-attr]
    assert len(r.semantic) == 1 and r.evidence()[0].kind == "semantic"
    off = mem.retrieve("a", z, use_sem=False, use_epi=False)
    assert off.semantic == () and off.episodic == () and len(off.visual) == 1
    pop = mem.retrieve("a", z, scope="population", use_sem=False)
    assert {h.record.patient_id for h in pop.episodic} == {"a", "b"}  # type: ignore[union-attr]


def test_bad_input_raises_and_leaves_store_unchanged(store: Store) -> None:
    """Wrong dimension, NaN, zero vector, empty patient or question: typed error, nothing stored."""
    mem = Memory(store)
    rng = np.random.default_rng(5)
    good = interaction("p", random_unit(rng), 1e9)
    bad = [
        interaction("p", random_unit(rng, DIM + 3), 1e9),
        interaction("p", np.full(DIM, np.nan), 1e9),
        interaction("p", np.zeros(DIM), 1e9),
        interaction("", random_unit(rng), 1e9),
        Interaction("p", random_unit(rng), "  ", ANSWER, 1e9),
        interaction("p", random_unit(rng), float("nan")),
    ]
    for b in bad:
        with pytest.raises(InvalidInput):
            mem.write_back_many([good, b])
    assert counts(store) == (0, 0, 0)
    with pytest.raises(InvalidVector):
        mem.retrieve("p", np.ones(DIM + 1))


def test_unknown_patient_retrieves_nothing(store: Store) -> None:
    """A patient without memory gets empty semantic, episodic and visual results."""
    mem = Memory(store)
    r = mem.retrieve("nobody", random_unit(np.random.default_rng(6)))
    assert r.semantic == () and r.episodic == () and r.visual == ()
