"""The data sets of `bench_peers.py` and their exact answers (see its docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from _peers_systems import DIM

PATIENT_ROWS = 10
PATIENT_K, POPULATION_K = 5, 10
TUNE_QUERIES = 200
TARGET_RECALL = 0.95
CXR_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "covid-cxr" / "images"


def _unit(x: np.ndarray) -> np.ndarray:
    unit: np.ndarray = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return unit


def _around(rng: np.random.Generator, centres: np.ndarray, cosine: float) -> np.ndarray:
    """Unit vectors at about ``cosine`` from each centre (a random direction added)."""
    noise = _unit(rng.standard_normal(centres.shape, dtype=np.float32))
    return _unit(centres + np.sqrt(1 / cosine**2 - 1) * noise)


def cxr_embeddings() -> np.ndarray | None:
    if not CXR_DIR.is_dir():
        return None
    from msm_mem import get_encoder

    files = sorted(p for p in CXR_DIR.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    z = get_encoder("pixels").encode_paths(files)
    # the same image under two names would make exact ties that systems break differently
    cos = z @ z.T
    keep = [i for i in range(len(z)) if not (cos[i, :i] > 0.9999).any()]
    return z[keep]


def make_data(kind: str, n: int, queries: int, out: Path, real: np.ndarray | None) -> dict[str, Any]:
    """Write x, patients and the queries of one data set to ``out``; its description."""
    rng = np.random.default_rng(17)
    patients = np.arange(n, dtype=np.int64) % max(1, n // PATIENT_ROWS)
    npat = int(patients.max()) + 1
    nq = queries + TUNE_QUERIES
    qp = rng.integers(npat, size=queries)
    out.mkdir(parents=True, exist_ok=True)
    x = np.lib.format.open_memmap(out / "x.npy", mode="w+", dtype=np.float32, shape=(n, DIM))
    if kind == "random":
        for a in range(0, n, 100_000):
            b = min(n, a + 100_000)
            x[a:b] = _unit(rng.standard_normal((b - a, DIM), dtype=np.float32))
        pq = _unit(rng.standard_normal((queries, DIM), dtype=np.float32))
        popq = _unit(rng.standard_normal((nq, DIM), dtype=np.float32))
        desc = "isotropic random unit vectors"
    else:
        assert real is not None
        m = len(real)
        centres = _around(rng, real[np.arange(npat) % m], 0.9)
        for a in range(0, n, 100_000):
            b = min(n, a + 100_000)
            x[a:b] = _around(rng, centres[patients[a:b]], 0.9)
        x[: min(m, n)] = real[: min(m, n)]  # the real embeddings themselves
        pq = _around(rng, centres[qp], 0.9)
        popq = _around(rng, centres[rng.integers(npat, size=nq)], 0.9)
        real_rows = min(m, n)
        desc = f"{real_rows} real pixels-encoder embeddings of the shared chest X-rays"
        desc += f" + {n - real_rows} clustered around them"
    x.flush()
    del x
    np.save(out / "patients.npy", patients)
    np.save(out / "pq.npy", pq)
    np.save(out / "pp.npy", qp)
    np.save(out / "popq.npy", popq)
    return {"kind": kind, "n": n, "patients": npat, "description": desc}


def make_truth(data: Path) -> None:
    """The exact answers every recall is measured against, written beside the data: population
    top-10 by FAISS flat (``faiss.knn``, inner product, all queries at once), patient top-5 by
    numpy over the patient's rows (the order of the numpy limit)."""
    import faiss

    x = np.load(data / "x.npy", mmap_mode="r")
    patients = np.load(data / "patients.npy")
    popq, pq, pp = np.load(data / "popq.npy"), np.load(data / "pq.npy"), np.load(data / "pp.npy")
    best_s = np.full((len(popq), POPULATION_K), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(popq), POPULATION_K), dtype=np.int64)
    for a in range(0, len(x), 100_000):  # in blocks: the rows need not fit in memory twice
        block = np.ascontiguousarray(x[a : a + 100_000])
        s, i = faiss.knn(popq, block, POPULATION_K, metric=faiss.METRIC_INNER_PRODUCT)
        all_s, all_i = np.hstack([best_s, s]), np.hstack([best_i, i + a])
        order = np.lexsort((all_i, -all_s), axis=1)[:, :POPULATION_K]
        best_s, best_i = np.take_along_axis(all_s, order, 1), np.take_along_axis(all_i, order, 1)
    np.save(data / "truth_pop.npy", best_i)
    order = np.argsort(patients, kind="stable")
    bounds = np.searchsorted(patients[order], np.arange(patients.max() + 2))
    truth = []
    for q, p in zip(pq, pp, strict=True):
        rows = order[bounds[p] : bounds[p + 1]]
        truth.append(rows[np.argsort(-(np.asarray(x[rows]) @ q), kind="stable")[:PATIENT_K]])
    np.save(data / "truth_patient.npy", np.array(truth))
