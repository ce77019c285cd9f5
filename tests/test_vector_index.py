"""The in-memory cosine index: exact scoped top-k, tie order, scope bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._storage.sqlite.vector_index import VectorIndex
from tests.conftest import DIM, random_unit


def brute_force(vectors: np.ndarray, positions: list[int], z: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Top-k by (descending cosine, ascending position), the contract's order, over numpy's
    matrix-vector product of the gathered rows (which may round copies of one vector apart)."""
    scores = (vectors[positions] @ z).tolist()
    ranked = sorted(zip(positions, scores, strict=True), key=lambda h: (-h[1], h[0]))
    return ranked[:k]


def build(rows: np.ndarray, scopes: list[str]) -> VectorIndex:
    index = VectorIndex(DIM)
    index.add(rows, scopes)
    return index


@settings(max_examples=40)
@given(
    n=st.integers(1, 80),
    scopes=st.integers(1, 4),
    k=st.integers(1, 30),
    duplicates=st.integers(0, 20),
    seed=st.integers(0, 10**6),
)
def test_scoped_top_k_equals_brute_force_with_ties(n: int, scopes: int, k: int, duplicates: int, seed: int) -> None:
    """top_k gives brute force's hits in its order, ties (copied vectors) by ascending position."""
    rng = np.random.default_rng(seed)
    rows = np.stack([random_unit(rng) for _ in range(n)])
    for _ in range(duplicates):  # exact ties: the same vector at several positions
        rows[rng.integers(n)] = rows[rng.integers(n)]
    names = [f"p{rng.integers(scopes)}" for _ in range(n)]
    index = build(rows, names)
    z = rows[rng.integers(n)]  # a stored vector as query, so its copies tie at the top
    labels = [f"E-{i}" for i in range(n)]
    for scope in sorted(set(names)):
        want = brute_force(rows, [i for i in range(n) if names[i] == scope], z, k)
        got = index.top_k(-z, k, scope, labels)
        assert got == [(labels[p], s) for p, s in want]
        assert index.search(z, k, scope) == want


@pytest.mark.parametrize("k", [1, 3, 40])
def test_equal_scores_come_in_insertion_order(k: int) -> None:
    """Equal cosines come by ascending position, on both the small and the partition path."""
    # entries of +-1/4: every product is exact, so a's copies score exactly 1 and b's exactly 0
    a = np.full(DIM, 0.25, dtype=np.float32)
    b = np.where(np.arange(DIM) % 2 == 0, a, -a)
    rows = np.stack([b if i % 3 else a for i in range(60)])  # a at 0, 3, 6, ...
    index = build(rows, ["p"] * 60)
    got = index.top_k(-a, k, "p", range(60))
    assert [p for p, _ in got] == list(range(0, 60, 3))[:k] + [i for i in range(60) if i % 3][: max(0, k - 20)]
    assert [s for _, s in got] == [1.0] * min(k, 20) + [0.0] * max(0, k - 20)


def test_scores_are_the_plain_cosines() -> None:
    """The negated query gives back exactly the cosines x @ z (negation only flips sign bits)."""
    rng = np.random.default_rng(1)
    rows = np.stack([random_unit(rng) for _ in range(12)])
    index = build(rows, ["p"] * 12)
    z = random_unit(rng)
    got = dict(index.top_k(-z, 12, "p", range(12)))
    assert got == {i: float(s) for i, s in enumerate(rows @ z)}


def test_empty_answers() -> None:
    """k <= 0, an unknown scope and an empty index give no hits; k above the scope size gives all."""
    index = VectorIndex(DIM)
    z = random_unit(np.random.default_rng(2))
    assert index.top_k(-z, 3, "p", []) == [] and index.search(z, 3, "p") == [] and index.search(z, 3, None) == []
    index.add(np.stack([z, -z]), ["p", "q"])
    assert index.top_k(-z, 0, "p", ["a", "b"]) == [] and index.top_k(-z, 2, "nobody", ["a", "b"]) == []
    assert [lab for lab, _ in index.top_k(-z, 10, "p", ["a", "b"])] == ["a"]


def test_moved_positions_are_searched_in_their_new_scope_in_order() -> None:
    """After move, the position leaves its old scope and joins the new one in ascending order."""
    rng = np.random.default_rng(3)
    z = random_unit(rng)
    index = build(np.stack([z] * 4), ["p", "q", "p", "q"])
    index.move(2, "p", "q")
    assert [p for p, _ in index.top_k(-z, 5, "q", range(4))] == [1, 2, 3]
    assert [p for p, _ in index.top_k(-z, 5, "p", range(4))] == [0]
    assert index.positions("q").tolist() == [1, 2, 3]


def test_rescope_needs_no_old_scope_and_follows_earlier_moves() -> None:
    """A position gets a new scope whatever it had, after scopes were set, added and moved."""
    rng = np.random.default_rng(4)
    z = random_unit(rng)
    index = VectorIndex(DIM)
    index.add(np.stack([z] * 3), ["p", "q", "p"])
    index.set_scopes(["p", "q", "q"])  # every stored position re-read
    index.add(np.stack([z]), ["r"])
    index.move(0, "p", "r")
    index.rescope(0, "q")
    index.rescope(3, "q")
    index.rescope(1, "q")  # already there: nothing moves
    assert index.positions("q").tolist() == [0, 1, 2, 3]
    assert index.positions("p").tolist() == [] and index.positions("r").tolist() == []
