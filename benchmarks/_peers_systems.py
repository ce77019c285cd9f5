"""The systems `bench_peers.py` compares: each builds from the same rows and answers the same
queries by row number. One class per system; a class may answer patient-scoped queries
(``patient_variants``), population queries (``population``), or both.

Every system is asked for the same thing: row numbers of the top-k by inner product (= cosine
on these unit vectors). Patient scope is restricted to one patient's rows; population scope to
none. Where a system cannot be asked for exactly that, the class says so in ``notes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import numpy as np

DIM = 1024
#: values tried for each approximate system's search knob, ascending, until recall@10 >= target
EF_VALUES = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
PG_EF_VALUES = [16, 32, 64, 128, 256, 512, 1000]  # pgvector caps hnsw.ef_search at 1000
NPROBES = [1, 2, 4, 8, 16, 32, 64, 128, 256]

Query = Callable[[np.ndarray, int], list[int]]
PatientQuery = Callable[[np.ndarray, int, int], list[int]]


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def batches(n: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(n, start + size)


class System:
    """Base: ``build`` (timed by the caller, in its own process) then, in a fresh process,
    ``open`` and the queries. ``knob`` tunes population search (None: exact)."""

    name = ""
    notes = ""
    knob: str | None = None
    knob_values: list[int] = []

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        raise NotImplementedError

    def open(self, d: Path) -> None:
        raise NotImplementedError

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        """(label, query, extra figures) per way this system answers a patient-scoped query."""
        return iter(())

    def population(self) -> Query | None:
        return None

    def set_knob(self, value: int) -> None:
        raise NotImplementedError

    def prepare_population(self, d: Path) -> dict[str, float]:
        """Build what population search needs beyond ``build`` (an index), timed; figures."""
        return {}

    def disk_bytes(self, d: Path) -> int:
        return dir_bytes(d)

    def versions(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass


class NumpyLimit(System):
    """The limit: numpy over the raw vectors held in memory (one BLAS product per query)."""

    name = "numpy"
    notes = "raw float32 rows in memory; patient rows gathered by precomputed row numbers"

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "x.npy", x)
        np.save(d / "patients.npy", patients)
        return {}

    def open(self, d: Path) -> None:
        self.x = np.load(d / "x.npy")
        patients = np.load(d / "patients.npy")
        order = np.argsort(patients, kind="stable")
        bounds = np.searchsorted(patients[order], np.arange(patients.max() + 2))
        self.rows = [order[bounds[p] : bounds[p + 1]] for p in range(patients.max() + 1)]

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        x, rows = self.x, self.rows

        def query(q: np.ndarray, p: int, k: int) -> list[int]:
            r = rows[p]
            s = x.take(r, 0) @ q
            top: list[int] = r[np.argsort(-s, kind="stable")[:k]].tolist()
            return top

        yield "numpy over the patient's rows", query, {}

    def population(self) -> Query:
        x = self.x

        def query(q: np.ndarray, k: int) -> list[int]:
            s = x @ q
            top = np.argpartition(-s, k)[:k]
            ranked: list[int] = top[np.argsort(-s[top], kind="stable")].tolist()
            return ranked

        return query

    def versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}


class FaissFlat(System):
    name = "faiss-flat"
    notes = "IndexFlatIP; patient scope through IDSelectorBatch over the patient's row numbers"

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        import faiss

        index = faiss.IndexFlatIP(DIM)
        for a, b in batches(len(x), 50_000):
            index.add(np.ascontiguousarray(x[a:b]))
        d.mkdir(parents=True, exist_ok=True)
        faiss.write_index(index, str(d / "flat.faiss"))
        np.save(d / "patients.npy", patients)
        return {}

    def open(self, d: Path) -> None:
        import faiss

        self.index = faiss.read_index(str(d / "flat.faiss"))
        patients = np.load(d / "patients.npy")
        order = np.argsort(patients, kind="stable")
        bounds = np.searchsorted(patients[order], np.arange(patients.max() + 2))
        self.rows = [order[bounds[p] : bounds[p + 1]].astype(np.int64) for p in range(patients.max() + 1)]

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        import faiss

        index, rows = self.index, self.rows

        def query(q: np.ndarray, p: int, k: int) -> list[int]:
            # faiss's stubs lack the keywords its Python wrapper of SearchParameters accepts
            params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(rows[p]))  # type: ignore[call-arg]
            _, ids = index.search(q[None, :], k, params=params)
            return [int(i) for i in ids[0] if i >= 0]

        yield "FAISS flat + IDSelectorBatch", query, {}

    def population(self) -> Query:
        index = self.index

        def query(q: np.ndarray, k: int) -> list[int]:
            _, ids = index.search(q[None, :], k)
            top: list[int] = ids[0].tolist()
            return top

        return query

    def versions(self) -> dict[str, str]:
        import faiss

        return {"faiss-cpu": faiss.__version__}


class FaissHnsw(System):
    name = "faiss-hnsw"
    notes = "IndexHNSWFlat, inner product, M=32, efConstruction=40 (FAISS defaults)"
    knob, knob_values = "efSearch", EF_VALUES

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        import faiss

        index = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
        # one batch, as the store's graph is built from its rows: FAISS links a batch in a
        # random order, where batches in the data set's order (a round of every patient, then
        # the next) make a worse graph
        index.add(np.ascontiguousarray(x))
        d.mkdir(parents=True, exist_ok=True)
        faiss.write_index(index, str(d / "hnsw.faiss"))
        return {}

    def open(self, d: Path) -> None:
        import faiss

        self.index = cast(faiss.IndexHNSWFlat, faiss.read_index(str(d / "hnsw.faiss")))

    def set_knob(self, value: int) -> None:
        self.index.hnsw.efSearch = value

    def population(self) -> Query:
        index = self.index

        def query(q: np.ndarray, k: int) -> list[int]:
            _, ids = index.search(q[None, :], k)
            top: list[int] = ids[0].tolist()
            return top

        return query

    def versions(self) -> dict[str, str]:
        import faiss

        return {"faiss-cpu": faiss.__version__}


class Hnswlib(System):
    name = "hnswlib"
    notes = "space ip, M=16, ef_construction=100 (Chroma's defaults for the same library)"
    knob, knob_values = "ef", EF_VALUES

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        import hnswlib

        index = hnswlib.Index(space="ip", dim=DIM)
        index.init_index(max_elements=len(x), M=16, ef_construction=100)
        # hnswlib links rows in the order given: a random order (the ids kept), for the reason
        # FAISS HNSW gets one batch
        order = np.random.default_rng(0).permutation(len(x))
        for a, b in batches(len(x), 50_000):
            ids = order[a:b]
            index.add_items(x[ids], ids)
        d.mkdir(parents=True, exist_ok=True)
        index.save_index(str(d / "hnswlib.bin"))
        return {}

    def open(self, d: Path) -> None:
        import hnswlib

        self.index = hnswlib.Index(space="ip", dim=DIM)
        self.index.load_index(str(d / "hnswlib.bin"))
        self.index.set_num_threads(1)  # one query per call, as every other system

    def set_knob(self, value: int) -> None:
        self.index.set_ef(value)

    def population(self) -> Query:
        index = self.index

        def query(q: np.ndarray, k: int) -> list[int]:
            labels, _ = index.knn_query(q, k=k)
            ids: list[int] = labels[0].tolist()
            return ids

        return query

    def versions(self) -> dict[str, str]:
        import importlib.metadata

        return {"hnswlib": importlib.metadata.version("hnswlib")}
