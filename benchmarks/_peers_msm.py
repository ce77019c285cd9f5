"""msm-mem as `bench_peers.py` runs it: a governed memory directory (``MsmMem.init``), each
dataset row stored as one episodic and one visual record with the same vector (what a consolidated
study holds), one semantic state per patient; queried through the store's search, the memory
core's retrieve and the public, audited ``MsmMem.retrieve``.

Besides the public call it measures internals, so it imports private modules: the rows are
written with the store's bulk write (precomputed vectors; ``ingest`` encodes images), the
store's search and the memory core's retrieve are timed apart from the governed call, and the
limits read the store's own vector cache and graph in place."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, cast

import numpy as np
import numpy.typing as npt
from _peers_systems import DIM, EF_VALUES, PatientQuery, Query, System, batches

from msm_mem import MsmMem, Principal, Purpose, Role, Settings
from msm_mem._storage.sqlite import SqliteStore
from msm_mem.plugins.encoders import BaseEncoder

ADMIN = Principal("bench-admin", Role.ADMIN, Purpose.OPERATIONS)
AGENT = Principal("bench-agent", Role.AGENT, Purpose.TREATMENT)

#: where msm-mem's directory waits for msm-mem-hnsw to reopen it (``--hnsw-from-exact``)
SEED = "msm-mem-seed"
#: the image handed to the public API; the lookup encoder below replaces its embedding
IMAGE = np.zeros((8, 8), dtype=np.float32)


class LookupEncoder(BaseEncoder):
    """Returns the vector set in ``next`` (the encoder's cost is not the memory's)."""

    name, dim = "pixels", DIM

    def __init__(self) -> None:
        self.next: np.ndarray = np.zeros(DIM, dtype=np.float32)

    def _encode_batch(self, images: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[np.float64]:
        return self.next[None, :].astype(np.float64)


def _ids(pairs: list[tuple[str, float]]) -> list[int]:
    return [int(rid[2:]) for rid, _ in pairs]


class MsmMemSystem(System):
    name = "msm-mem"
    notes = (
        "MsmMem.init directory (SQLite WAL + FAISS cache, PHI fields envelope-encrypted); each row "
        "an episodic + a visual record (the same vector) and one semantic state per patient, "
        "bulk-written 5,000 rows per transaction; exact population search"
    )
    mode: Literal["exact", "hnsw"] = "exact"

    def _settings(self) -> Settings:
        return Settings(population_search=self.mode)

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        from msm_mem import EpisodicRecord, FixedClock, Impression, SemanticState, VisualRecord
        from msm_mem._storage.base import WriteBatch

        mem = MsmMem.init(d, ADMIN, settings=self._settings(), clock=FixedClock(1.7e9))
        store = mem._store
        t0 = time.perf_counter()  # the writes, not the directory's keys and consent policy
        for a, b in batches(len(x), 5000):
            episodes = [
                EpisodicRecord(
                    f"E-{i}",
                    f"P{patients[i]}",
                    1.6e9,
                    x[i],
                    "What is the impression?",
                    "Right lower lobe consolidation.",
                    "treat",
                    f"img/{i}.png",
                    "",
                    f"s{i}",
                )
                for i in range(a, b)
            ]
            visuals = [
                VisualRecord(f"V-{i}", f"P{patients[i]}", 1.6e9, x[i], f"img/{i}.png", "PA", f"E-{i}")
                for i in range(a, b)
            ]
            store.write(WriteBatch(episodes=episodes, visuals=visuals))
        build_s = time.perf_counter() - t0
        t_sem = time.perf_counter()
        imp = (Impression(1.6e9, "Right lower lobe consolidation."),)
        ids = np.unique(patients)
        for a, b in batches(len(ids), 10_000):
            store.write(WriteBatch(semantic=[SemanticState(f"S-{p}", f"P{p}", "impression", imp) for p in ids[a:b]]))
        semantic_s = time.perf_counter() - t_sem
        t_close = time.perf_counter()
        mem.close()  # saves the FAISS caches (and links the HNSW tail)
        return {"build_s": build_s + time.perf_counter() - t_close, "semantic_s": semantic_s}

    def open(self, d: Path) -> None:
        from msm_mem import FixedClock
        from msm_mem._memory.msm import Memory

        self.encoder = LookupEncoder()
        self.mem = MsmMem.open(d, settings=self._settings(), encoder=self.encoder, clock=FixedClock(1.7e9))
        self.store = cast(SqliteStore, self.mem._store)
        self.memory = Memory(self.store)
        self.agent = AGENT

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        store, memory, mem, enc, agent = self.store, self.memory, self.mem, self.encoder, self.agent

        def search(q: np.ndarray, p: int, k: int) -> list[int]:
            return _ids(store.search_many(q, [("episodic", k)], f"P{p}")[0])

        def search_ev(q: np.ndarray, p: int, k: int) -> list[int]:
            return _ids(store.search_many(q, [("episodic", k), ("visual", k)], f"P{p}")[0])

        def retrieve(q: np.ndarray, p: int, k: int) -> list[int]:
            r = memory.retrieve(f"P{p}", q, k_epi=k, k_vis=k)
            return [int(h.id[2:]) for h in r.episodic]

        def governed(q: np.ndarray, p: int, k: int) -> list[int]:
            enc.next = q
            r = mem.retrieve(agent, f"P{p}", IMAGE)
            return [int(i.evidence.id[2:]) for i in r.items if i.evidence.kind == "episodic"][:k]

        yield "msm-mem `search_many` E", search, {}
        yield "msm-mem `search_many` E+V", search_ev, {}
        yield "msm-mem `Memory.retrieve` S+E+V", retrieve, {}
        yield "msm-mem `MsmMem.retrieve` S+E+V (governed, audited)", governed, {}

    def population(self) -> Query:
        store = self.store

        def query(q: np.ndarray, k: int) -> list[int]:
            return _ids(store.search_many(q, [("episodic", k)], None)[0])

        return query

    def patient_limit(self) -> PatientQuery:
        """numpy over the patient's rows of the store's own vectors (read in place)."""
        index = self.store._vectors._index["episodic"]
        view, ids = index.vectors(), self.store._vectors._ids["episodic"]

        def query(q: np.ndarray, p: int, k: int) -> list[int]:
            rows = index.positions(f"P{p}")
            s = view.take(rows, 0) @ q
            return [int(ids[r][2:]) for r in rows[np.argsort(-s, kind="stable")[:k]]]

        return query

    def population_limit(self) -> Query:
        """One BLAS matrix-vector product over the store's own vectors (read in place) and a top-k."""
        view = self.store._vectors._index["episodic"].vectors()

        def query(q: np.ndarray, k: int) -> list[int]:
            s = view @ q
            top = np.argpartition(-s, k)[:k]
            ranked: list[int] = top[np.argsort(-s[top], kind="stable")].tolist()
            return ranked

        return query

    def population_extras(self) -> Iterator[tuple[str, Query]]:
        mem, enc, agent = self.mem, self.encoder, self.agent

        def governed(q: np.ndarray, k: int) -> list[int]:
            enc.next = q
            r = mem.retrieve(agent, "P0", IMAGE, scope="population")
            return [int(i.evidence.id[2:]) for i in r.items if i.evidence.kind == "episodic"][:k]

        yield f"{self.name} `MsmMem.retrieve(scope='population')` S+E+V (governed, audited)", governed

    def versions(self) -> dict[str, str]:
        import importlib.metadata
        import sqlite3

        return {"msm-mem": importlib.metadata.version("msm-mem"), "sqlite": sqlite3.sqlite_version}

    def close(self) -> None:
        self.mem.close()


class MsmMemHnsw(MsmMemSystem):
    name = "msm-mem-hnsw"
    notes = (
        "as msm-mem, with the setting population_search='hnsw' (FAISS HNSW over 8-bit codes of the "
        "stored vectors, M=32, efConstruction=40, the best 2k candidates scored exactly; linked in "
        "batches of 1,024, rebuilt in one batch when it doubles); "
        "population_ef_search tuned"
    )
    mode = "hnsw"
    knob, knob_values = "population_ef_search", EF_VALUES

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        """Written as msm-mem writes, or (``--hnsw-from-exact``) msm-mem's directory reopened
        with the HNSW setting: the store links every cached vector into new graphs on open."""
        seed = d.parent / SEED
        if not seed.is_dir():
            return super().build(d, x, patients)
        seed.rename(d)
        t0 = time.perf_counter()
        MsmMem.open(d, settings=self._settings()).close()
        return {"build_s": time.perf_counter() - t0, "from_exact": 1.0}

    def set_knob(self, value: int) -> None:
        for index in self.store._vectors._index.values():
            assert index.graph is not None
            index.graph.ef_search = value

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        return iter(())  # patient scope is exact either way: measured once, on msm-mem

    def population_limit(self) -> Query:
        """The store's own graph of episodic vectors searched directly at the same depth
        (``Graph.search``: the walk on its 8-bit codes, the best 2k candidates scored exactly
        from the flat vectors), without the lock, validation, retired-row filter, tail or id
        mapping: msm-mem's overhead."""
        vectors = self.store._vectors._index["episodic"]
        graph = vectors.graph
        assert graph is not None
        none = np.zeros(0, dtype=np.int64)

        def query(q: np.ndarray, k: int) -> list[int]:
            return [p for p, _ in graph.search(q, k, none, 0, vectors._index)]

        return query
