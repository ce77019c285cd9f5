"""The recall of the embedded store's population graph against a FAISS HNSW index built in one
batch on the same vectors, when the rows arrive as a patient's rows do: spread over time,
between other patients' rows (every patient's first row, then every patient's second, ...).

Linked only in that order, 1,024 rows at a time (the graph before it was rebuilt in one batch
when it doubles), the store's graph of these rows recalled 0.958 of the top-10 at depth 32
where FAISS's build of the same rows in one batch recalled 0.997: this test failed. The rows
are the benchmark's realistic ones (``bench_peers.py``): the shared chest X-rays' ``pixels``
embeddings, a clustered generator around them. (The graph now also links the rows between
builds at level 0 only; ``test_population_search.py`` checks why.)
"""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest

from msm_mem._storage.sqlite.graph import EF_CONSTRUCTION, TAIL, M
from msm_mem._storage.sqlite.vector_index import VectorIndex

pytestmark = pytest.mark.slow

IMAGES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "covid-cxr" / "images"
CLUSTERS, ROWS, PATIENT_ROWS, QUERIES, K, DEPTH = 20, 20_000, 10, 300, 10, 32


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _around(rng: np.random.Generator, centres: np.ndarray, cosine: float) -> np.ndarray:
    noise = _unit(rng.standard_normal(centres.shape, dtype=np.float32))
    return _unit(centres + np.sqrt(1 / cosine**2 - 1) * noise)


def _real_embeddings() -> np.ndarray:
    if not IMAGES.is_dir():
        pytest.skip(f"the shared chest X-rays are absent ({IMAGES.name} under shared/data/covid-cxr)")
    from msm_mem.plugins.encoders import get_encoder
    from msm_mem.plugins.images import load_image

    files = sorted(p for p in IMAGES.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    z = np.asarray(get_encoder("pixels").encode([load_image(f) for f in files]), dtype=np.float32)
    cos = z @ z.T
    distinct = [i for i in range(len(z)) if not (cos[i, :i] > 0.9999).any()]
    assert len(distinct) >= CLUSTERS
    return _unit(z[distinct[:CLUSTERS]])


def _recall(got: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(t.tolist())) / K for g, t in zip(got, truth, strict=True)]))


def test_a_graph_linked_in_arrival_order_recalls_as_much_as_one_built_in_one_batch() -> None:
    real = _real_embeddings()
    rng = np.random.default_rng(17)
    patients = ROWS // PATIENT_ROWS
    centres = _around(rng, real[np.arange(patients) % CLUSTERS], 0.9)
    x = _around(rng, centres[np.arange(ROWS) % patients], 0.9)  # row i: patient i mod patients
    queries = _around(rng, centres[rng.integers(patients, size=QUERIES)], 0.9)
    _, truth = faiss.knn(queries, x, K, metric=faiss.METRIC_INNER_PRODUCT)

    store = VectorIndex(x.shape[1], ef_search=DEPTH)
    for a in range(0, ROWS, TAIL):  # written as they arrive, linked a tail at a time
        store.add(x[a : a + TAIL], [f"P{i % patients}" for i in range(a, min(ROWS, a + TAIL))])
    store.link()
    assert store.graph is not None and store.graph.covered == ROWS
    assert np.array_equal(store.vectors(), x)  # positions are the rows, in order, after the rebuilds
    got_store = [[p for p, _ in store.population(q, K, None)] for q in queries]

    ref = faiss.IndexHNSWFlat(x.shape[1], M, faiss.METRIC_INNER_PRODUCT)
    ref.hnsw.efConstruction = EF_CONSTRUCTION
    ref.add(x)
    params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
    params.efSearch = DEPTH
    _, got_ref = ref.search(queries, K, params=params)

    r_store, r_ref = _recall(got_store, truth), _recall(got_ref.tolist(), truth)
    assert r_ref >= 0.95  # the rows are easy for a graph built in one batch
    assert r_store >= r_ref - 0.03, f"store graph recall@{K} {r_store:.3f}, FAISS one batch {r_ref:.3f}"
