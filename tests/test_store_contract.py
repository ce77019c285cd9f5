"""The store contract: every backend in conftest.BACKENDS must pass these tests."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msm_mem import (
    EpisodicRecord,
    IllegalTransition,
    Impression,
    InvalidInput,
    InvalidVector,
    NotFound,
    SemanticState,
    State,
    StoreError,
    VisualRecord,
    WriteConflict,
)
from msm_mem._agent.stored import study_episode, study_image
from msm_mem._storage.base import PII_FIELDS, StateChange, Store, VectorKind, WriteBatch
from tests.conftest import DIM, StoreFactory, random_unit

pytestmark = pytest.mark.cluster


def episode(i: int, patient: str, z: np.ndarray, **kw: object) -> EpisodicRecord:
    return EpisodicRecord(
        episode_id=f"E-{i}",
        patient_id=patient,
        timestamp=1e9 + i,
        z=z,
        question="q?",
        answer=f"answer {i}",
        **{"study_id": f"s{i}", **kw},
    )  # type: ignore[arg-type]


def visual(i: int, patient: str, z: np.ndarray) -> VisualRecord:
    return VisualRecord(visual_id=f"V-{i}", patient_id=patient, timestamp=1e9 + i, z=z, source_episode_id=f"E-{i}")


def state(sid: str, patient: str, text: str, version: int = 1, supersedes: str | None = None) -> SemanticState:
    return SemanticState(sid, patient, "impression", (Impression(1e9, text),), version=version, supersedes=supersedes)


def fill(store: Store, n: int, patients: int, seed: int = 0) -> list[EpisodicRecord]:
    rng = np.random.default_rng(seed)
    records = [episode(i, f"p{i % patients}", random_unit(rng)) for i in range(n)]
    store.write(WriteBatch(episodes=records))
    return records


def test_round_trip_of_records(store: Store) -> None:
    """Stored records come back field for field, vectors bit for bit, in the order asked."""
    rng = np.random.default_rng(1)
    e = episode(1, "p1", random_unit(rng), decision="treat", media_path="/img/1.png", confidence=0.5)
    v = visual(1, "p1", e.z)
    store.write(WriteBatch(episodes=[e], visuals=[v]))
    got = store.get_episodes(["E-1"])[0]
    assert got == e and np.array_equal(got.z, e.z)
    assert store.get_visuals(["V-1"])[0] == v
    assert store.count("episodic") == 1 and store.count("visual") == 1


def test_iteration_keeps_insertion_order(store: Store) -> None:
    """The i-th record iterated is the i-th inserted, across several writes."""
    records = fill(store, 7, 3)
    more = fill_more = [episode(100 + i, "p9", random_unit(np.random.default_rng(i))) for i in range(3)]
    store.write(WriteBatch(episodes=fill_more))
    assert [r.episode_id for r in store.iter_episodes()] == [r.episode_id for r in records + more]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 60), patients=st.integers(1, 5), k=st.integers(1, 12), seed=st.integers(0, 10**6))
def test_patient_scope_is_exact_top_k(make_store: StoreFactory, n: int, patients: int, k: int, seed: int) -> None:
    """Patient-scoped top-k equals numpy brute force over that patient's vectors."""
    store = make_store()
    records = fill(store, n, patients, seed)
    rng = np.random.default_rng(seed + 1)
    zq = random_unit(rng)
    for p in {r.patient_id for r in records}:
        mine = [r for r in records if r.patient_id == p]
        scores = np.array([float(np.dot(r.z, zq)) for r in mine])
        want = sorted(scores, reverse=True)[:k]
        got = store.search("episodic", zq, k, p)
        assert len(got) == len(want)
        assert np.allclose([s for _, s in got], want, atol=1e-5)
        assert all(i.startswith("E-") and store.get_episodes([i])[0].patient_id == p for i, _ in got)


def test_population_scope_searches_every_patient(store: Store) -> None:
    """scope=None ranks all records; the best match of another patient is found."""
    records = fill(store, 30, 6)
    target = records[17]
    got = store.search("episodic", target.z, 3, None)
    assert got[0][0] == target.episode_id and got[0][1] == pytest.approx(1.0, abs=1e-5)
    assert store.search("episodic", target.z, 3, "nobody") == []


def test_bad_vectors_are_refused_and_nothing_is_written(store: Store) -> None:
    """Wrong dimension, NaN and zero vectors raise InvalidVector; the store is unchanged."""
    rng = np.random.default_rng(2)
    good = episode(1, "p", random_unit(rng))
    bad_dim = episode(2, "p", random_unit(rng, DIM + 1))
    nan = episode(3, "p", np.full(DIM, np.nan, dtype=np.float32))
    zero = episode(4, "p", np.zeros(DIM, dtype=np.float32))
    for bad in (bad_dim, nan, zero):
        with pytest.raises(InvalidVector):
            store.write(WriteBatch(episodes=[good, bad]))
    assert store.count("episodic") == 0
    with pytest.raises(InvalidVector):
        store.search("episodic", np.zeros(DIM, dtype=np.float32), 1, "p")


def test_bad_query_vectors_are_refused_by_every_scope(store: Store) -> None:
    """search_many raises InvalidVector for a wrong dimension, NaN, zero or float64 query, any scope."""
    fill(store, 4, 2)
    bad = [
        random_unit(np.random.default_rng(0), DIM + 1),
        np.full(DIM, np.nan, dtype=np.float32),
        np.zeros(DIM, dtype=np.float32),
        random_unit(np.random.default_rng(1)).astype(np.float64),
    ]
    for z in bad:
        for scope in ("p0", "", None, "nobody"):
            with pytest.raises(InvalidVector):
                store.search_many(z, [("episodic", 2), ("visual", 2)], scope)  # type: ignore[arg-type]


def test_search_many_equals_one_search_per_kind(store: Store) -> None:
    """E and V asked together give what separate searches give, in the order asked, every scope."""
    rng = np.random.default_rng(4)
    records = [episode(i, f"p{i % 3}", random_unit(rng)) for i in range(24)]
    store.write(
        WriteBatch(episodes=records, visuals=[visual(i, r.patient_id, random_unit(rng)) for i, r in enumerate(records)])
    )
    store.write(
        WriteBatch(
            changes=[
                StateChange(
                    "episodic",
                    "E-0",
                    State.ACTIVE,
                    State.ANONYMIZED,
                    new_id="E-anon",
                    new_patient_id="",
                    fields=tuple((f, "scrubbed") for f in PII_FIELDS["episodic"]),
                ),
                StateChange("episodic", "E-3", State.ACTIVE, State.SUPERSEDED),
            ]
        )
    )
    requests: list[tuple[VectorKind, int]] = [("episodic", 3), ("visual", 5), ("episodic", 0), ("episodic", 40)]
    sizes = {}
    for scope in ("p0", "p1", "", None, "nobody"):
        zq = random_unit(rng)
        want = [store.search(kind, zq, k, scope) for kind, k in requests]
        assert store.search_many(zq, requests, scope) == want
        sizes[scope] = [len(w) for w in want]
    # p0 lost E-0 (anonymised into "") and E-3 (superseded, searched nowhere)
    assert sizes == {
        "p0": [3, 5, 0, 6],
        "p1": [3, 5, 0, 8],
        "": [1, 0, 0, 1],
        None: [3, 5, 0, 23],
        "nobody": [0, 0, 0, 0],
    }


def test_equal_cosines_come_in_insertion_order(store: Store) -> None:
    """Copies of one vector tie exactly; E and V list them by insertion order, also after writes."""
    # entries of +-1/4 (unit norm at DIM = 16): every product and sum is exact in float32
    a = np.full(DIM, 0.25, dtype=np.float32)
    b = np.where(np.arange(DIM) % 2 == 0, a, -a)
    first = [episode(i, "p" if i % 2 else "q", a if i % 3 else b) for i in range(12)]
    store.write(WriteBatch(episodes=first, visuals=[visual(i, r.patient_id, r.z) for i, r in enumerate(first)]))
    later = [episode(i, "p", a) for i in range(12, 15)]
    store.write(WriteBatch(episodes=later, visuals=[visual(i, r.patient_id, r.z) for i, r in enumerate(later, 12)]))
    ties = [i for i in range(15) if (i % 2 or i >= 12) and (i % 3 or i >= 12)]  # p's copies of a
    got_e, got_v = store.search_many(a, [("episodic", 4), ("visual", len(ties) + 5)], "p")
    assert got_e == [(f"E-{i}", 1.0) for i in ties[:4]]
    assert got_v[: len(ties)] == [(f"V-{i}", 1.0) for i in ties]
    assert [s for _, s in got_v[len(ties) :]] == [0.0] * 2  # p's copies of b (at 3 and 9) follow


def test_a_failing_batch_stores_nothing(store: Store) -> None:
    """A duplicate id late in a batch rolls back the whole batch, index included: the store
    refuses it as a conflict (another writer stored that record first)."""
    rng = np.random.default_rng(3)
    fill(store, 2, 1)
    dup = episode(0, "p0", random_unit(rng))  # E-0 exists already
    fresh = episode(50, "p0", random_unit(rng))
    with pytest.raises(WriteConflict):
        store.write(WriteBatch(episodes=[fresh, dup], semantic=[state("S-x", "p0", "t")]))
    assert store.count("episodic") == 2 and store.count("semantic") == 0
    assert all(i != "E-50" for i, _ in store.search("episodic", fresh.z, 5, "p0"))
    store.write(WriteBatch(episodes=[fresh]))  # positions stay consistent after the rollback
    assert store.search("episodic", fresh.z, 1, "p0")[0][0] == "E-50"


def test_semantic_supersession_keeps_one_active_version(store: Store) -> None:
    """A new version supersedes the active one; history keeps both; only one is active."""
    store.write(WriteBatch(semantic=[state("S-1", "p", "first")]))
    store.write(WriteBatch(semantic=[state("S-2", "p", "second", 2, supersedes="S-1")]))
    active = store.semantic_active("p")
    assert [s.state_id for s in active] == ["S-2"]
    history = store.semantic_history("p", "impression")
    assert [(s.state_id, s.state) for s in history] == [("S-1", State.SUPERSEDED), ("S-2", State.ACTIVE)]


def test_second_active_semantic_version_is_refused(store: Store) -> None:
    """A version that does not supersede the active one fails and writes nothing."""
    store.write(WriteBatch(semantic=[state("S-1", "p", "first")]))
    with pytest.raises(IllegalTransition):
        store.write(WriteBatch(semantic=[state("S-2", "p", "rogue", 2)]))
    with pytest.raises(IllegalTransition):
        store.write(WriteBatch(semantic=[state("S-3", "p", "late", 2, supersedes="S-404")]))
    assert [s.state_id for s in store.semantic_history("p", "impression")] == ["S-1"]


def test_state_changes_move_records_between_scopes(store: Store) -> None:
    """Anonymisation moves a record to the anonymous pool; supersession hides it from search."""
    records = fill(store, 4, 1)
    a, b = records[0], records[1]
    store.write(
        WriteBatch(
            changes=[
                StateChange(
                    "episodic",
                    a.episode_id,
                    State.ACTIVE,
                    State.ANONYMIZED,
                    new_id="E-anon",
                    new_patient_id="",
                    fields=tuple((f, "scrubbed") for f in PII_FIELDS["episodic"]),
                ),
                StateChange("episodic", b.episode_id, State.ACTIVE, State.SUPERSEDED),
            ]
        )
    )
    ids = [i for i, _ in store.search("episodic", a.z, 10, "p0")]
    assert a.episode_id not in ids and b.episode_id not in ids and len(ids) == 2
    assert store.search("episodic", a.z, 1, "")[0][0] == "E-anon"
    assert b.episode_id not in [i for i, _ in store.search("episodic", b.z, 10, None)]
    anon = store.get_episodes(["E-anon"])[0]
    assert anon.patient_id == "" and anon.state == State.ANONYMIZED and anon.answer == "scrubbed"
    with pytest.raises(NotFound):
        store.get_episodes([a.episode_id])


def test_rekeying_without_rewriting_phi_is_refused(store: Store) -> None:
    """Anonymisation must rewrite every PHI field (old ciphertexts are bound to the old id)."""
    records = fill(store, 1, 1)
    change = StateChange(
        "episodic",
        records[0].episode_id,
        State.ACTIVE,
        State.ANONYMIZED,
        new_id="E-new",
        new_patient_id="",
        fields=(("answer", "x"),),
    )
    with pytest.raises(InvalidInput, match="every PHI field"):
        store.write(WriteBatch(changes=[change]))
    assert store.get_episodes([records[0].episode_id])[0].state == State.ACTIVE


def test_state_change_from_the_wrong_state_is_refused(store: Store) -> None:
    """A change whose expected state does not match fails and leaves the record as it was."""
    records = fill(store, 2, 1)
    with pytest.raises(IllegalTransition):
        store.write(
            WriteBatch(changes=[StateChange("episodic", records[0].episode_id, State.SUPERSEDED, State.ACTIVE)])
        )
    with pytest.raises(NotFound):
        store.write(WriteBatch(changes=[StateChange("episodic", "E-missing", State.ACTIVE, State.SUPERSEDED)]))
    assert store.get_episodes([records[0].episode_id])[0].state == State.ACTIVE


def test_unknown_ids_raise_not_found(store: Store) -> None:
    """get_* with an unknown id raises NotFound (a LookupError)."""
    fill(store, 1, 1)
    with pytest.raises(LookupError):
        store.get_episodes(["E-0", "E-nope"])
    with pytest.raises(NotFound):
        store.get_visuals(["V-nope"])


def test_patients_and_studies(store: Store) -> None:
    """patients() lists identified patients; studies() the stored study ids of one."""
    fill(store, 5, 2)
    assert store.patients() == ["p0", "p1"]
    assert store.studies("p1") == {"s1", "s3"}
    assert store.has_patient("p0") and not store.has_patient("p7")


def test_closed_store_refuses_use(make_store: StoreFactory) -> None:
    """After close(), every call raises StoreError."""
    store = make_store()
    store.close()
    with pytest.raises(StoreError):
        store.count("episodic")


def test_max_cosine_is_the_top_score_of_the_scope(store: Store) -> None:
    """max_cosine equals the best top-1 score over the kinds asked; None for a scope without
    vectors; superseded vectors do not count; a bad query is refused."""
    records = fill(store, 12, 3)
    rng = np.random.default_rng(5)
    store.write(WriteBatch(visuals=[visual(i, "p0", random_unit(rng)) for i in range(20, 24)]))
    for _ in range(5):
        z = random_unit(rng)
        for kinds in (("episodic",), ("visual",), ("episodic", "visual")):
            want = max(s for hits in store.search_many(z, [(k, 1) for k in kinds], "p0") for _, s in hits)
            assert store.max_cosine(z, kinds, "p0") == want
    assert store.max_cosine(random_unit(rng), ("visual",), "p1") is None
    assert store.max_cosine(random_unit(rng), ("episodic", "visual"), "nobody") is None
    store.write(WriteBatch(changes=[StateChange("episodic", records[0].episode_id, State.ACTIVE, State.SUPERSEDED)]))
    assert store.max_cosine(records[0].z, ("episodic",), "p0") < 0.999
    with pytest.raises(InvalidVector):
        store.max_cosine(np.zeros(DIM, dtype=np.float32), ("episodic",), "p0")


def test_a_studys_episodes_come_active_first_then_newest(store: Store) -> None:
    """A patient's study lists its active episodes first, then the newest; another patient's
    study, a blank id or an unknown one is empty. The study's image is that of the first
    episode that recorded one (an episode written from an array has none)."""
    rng = np.random.default_rng(7)
    older = episode(1, "p1", random_unit(rng), study_id="s", media_path="/img/older.png")
    newer = episode(2, "p1", random_unit(rng), study_id="s", media_path="/img/newer.png")
    other = episode(3, "p2", random_unit(rng), study_id="t")
    store.write(WriteBatch(episodes=[older, newer, other]))
    zs = {"E-1": older.z, "E-2": newer.z}

    def order() -> list[str]:
        found = store.study_episodes("p1", "s")
        assert all(np.array_equal(e.z, zs[e.episode_id]) for e in found)
        return [e.media_path for e in found]

    assert order() == ["/img/newer.png", "/img/older.png"]
    store.write(WriteBatch(changes=[StateChange("episodic", "E-2", State.ACTIVE, State.SUPERSEDED)]))
    assert order() == ["/img/older.png", "/img/newer.png"]
    store.write(WriteBatch(changes=[StateChange("episodic", "E-1", State.ACTIVE, State.SUPERSEDED)]))
    assert order() == ["/img/newer.png", "/img/older.png"]
    assert [e.media_path for e in store.study_episodes("p1", "s", 1)] == ["/img/newer.png"]
    assert store.study_episodes("p1", "s", 0) == [] and len(store.study_episodes("p1", "s", 5)) == 2
    assert store.study_episodes("p1", "t") == [] and store.study_episodes("p2", "s") == []
    assert store.study_episodes("p1", "") == [] and store.study_episodes("p1", "nope") == []

    no_image = episode(4, "p1", random_unit(rng), study_id="s", media_path="")
    store.write(WriteBatch(episodes=[no_image]))
    assert study_episode(store, "p1", "s").episode_id == "E-4"
    assert study_image(store, "p1", "s") == "/img/newer.png"
    only_array = episode(5, "p1", random_unit(rng), study_id="u", media_path="")
    store.write(WriteBatch(episodes=[only_array]))
    with pytest.raises(NotFound, match="no stored image"):
        study_image(store, "p1", "u")
    with pytest.raises(NotFound, match="no stored study"):
        study_episode(store, "p1", "nope")
