"""The systems `bench_peers.py` compares: each builds from the same rows and answers the same
queries by row number. One class per system; a class may answer patient-scoped queries
(``patient_variants``), population queries (``population``), or both.

Every system is asked for the same thing: row numbers of the top-k by inner product (= cosine
on these unit vectors). Patient scope is restricted to one patient's rows; population scope to
none. Where a system cannot be asked for exactly that, the class says so in ``notes``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

DIM = 1024
ADMIN = ("bench-admin", "admin", "operations")
AGENT = ("bench-agent", "agent", "treatment")
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
            return r[np.argsort(-s, kind="stable")[:k]].tolist()

        yield "numpy over the patient's rows", query, {}

    def population(self) -> Query:
        x = self.x

        def query(q: np.ndarray, k: int) -> list[int]:
            s = x @ q
            top = np.argpartition(-s, k)[:k]
            return top[np.argsort(-s[top], kind="stable")].tolist()

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
            params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(rows[p]))
            _, ids = index.search(q[None, :], k, params=params)
            return [int(i) for i in ids[0] if i >= 0]

        yield "FAISS flat + IDSelectorBatch", query, {}

    def population(self) -> Query:
        index = self.index

        def query(q: np.ndarray, k: int) -> list[int]:
            _, ids = index.search(q[None, :], k)
            return ids[0].tolist()

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
        for a, b in batches(len(x), 50_000):
            index.add(np.ascontiguousarray(x[a:b]))
        d.mkdir(parents=True, exist_ok=True)
        faiss.write_index(index, str(d / "hnsw.faiss"))
        return {}

    def open(self, d: Path) -> None:
        import faiss

        self.index = faiss.read_index(str(d / "hnsw.faiss"))

    def set_knob(self, value: int) -> None:
        self.index.hnsw.efSearch = value

    def population(self) -> Query:
        index = self.index

        def query(q: np.ndarray, k: int) -> list[int]:
            _, ids = index.search(q[None, :], k)
            return ids[0].tolist()

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
        for a, b in batches(len(x), 50_000):
            index.add_items(x[a:b], np.arange(a, b))
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
            return labels[0].tolist()

        return query

    def versions(self) -> dict[str, str]:
        import importlib.metadata

        return {"hnswlib": importlib.metadata.version("hnswlib")}


class Chroma(System):
    name = "chroma"
    notes = (
        "PersistentClient, one collection, hnsw space ip (M=16, construction_ef=100); the patient "
        "as metadata; patient scope `where={'patient': p}`; population at its default ef_search "
        "(100), untuned: Chroma 1.5.9 applies ef_search only when a collection is created "
        "(`modify` leaves the loaded index's depth as it was: measured), and a rebuild per value "
        "takes too long"
    )

    def _client(self, d: Path) -> Any:
        import chromadb

        return chromadb.PersistentClient(path=str(d), settings=chromadb.Settings(anonymized_telemetry=False))

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        client = self._client(d)
        col = client.create_collection("items", configuration={"hnsw": {"space": "ip"}}, embedding_function=None)
        size = min(5000, client.get_max_batch_size())
        for a, b in batches(len(x), size):
            col.add(
                ids=[str(i) for i in range(a, b)],
                embeddings=x[a:b],
                metadatas=[{"patient": int(p)} for p in patients[a:b]],
            )
        return {}

    def open(self, d: Path) -> None:
        self.client = self._client(d)
        self.col = self.client.get_collection("items", embedding_function=None)

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        col = self.col

        def query(q: np.ndarray, p: int, k: int) -> list[int]:
            r = col.query(query_embeddings=q[None, :], n_results=k, where={"patient": p}, include=[])
            return [int(i) for i in r["ids"][0]]

        yield "Chroma `where` filter", query, {}

    def population(self) -> Query:
        col = self.col

        def query(q: np.ndarray, k: int) -> list[int]:
            r = col.query(query_embeddings=q[None, :], n_results=k, include=[])
            return [int(i) for i in r["ids"][0]]

        return query

    def versions(self) -> dict[str, str]:
        import chromadb

        return {"chromadb": chromadb.__version__}


class Lance(System):
    name = "lancedb"
    notes = (
        "one table (id, patient int32, vector 1024 x float32); patient scope a prefiltered "
        "`where patient = p` over a flat (exact) scan, then with a BTREE index on patient; "
        "population through an IVF_PQ index (dot, sqrt(N) partitions, 64 sub-vectors) re-ranked "
        "on the full vectors (refine_factor 10), nprobes tuned"
    )
    knob, knob_values = "nprobes", NPROBES

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        import lancedb
        import pyarrow as pa

        db = lancedb.connect(str(d))

        def chunk(a: int, b: int) -> pa.Table:
            vec = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(x[a:b]).ravel()), DIM)
            ids = pa.array(np.arange(a, b, dtype=np.int64))
            return pa.table({"id": ids, "patient": pa.array(patients[a:b].astype(np.int32)), "vector": vec})

        table = None
        for a, b in batches(len(x), 50_000):
            table = db.create_table("items", chunk(a, b)) if table is None else table
            if a:
                table.add(chunk(a, b))
        return {}

    def open(self, d: Path) -> None:
        import lancedb

        self.table = lancedb.connect(str(d)).open_table("items")

    def _patient(self) -> PatientQuery:
        table = self.table

        def query(q: np.ndarray, p: int, k: int) -> list[int]:
            s = table.search(q).distance_type("dot").where(f"patient = {p}", prefilter=True).limit(k).select(["id"])
            return s.to_arrow().column("id").to_pylist()

        return query

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        yield "LanceDB prefiltered `where`, no scalar index", self._patient(), {}
        t0 = time.perf_counter()
        self.table.create_scalar_index("patient", index_type="BTREE")
        yield "LanceDB prefiltered `where` + BTREE", self._patient(), {"index_s": time.perf_counter() - t0}

    def prepare_population(self, d: Path) -> dict[str, float]:
        n = self.table.count_rows()
        t0 = time.perf_counter()
        self.table.create_index(
            metric="dot", index_type="IVF_PQ", num_partitions=max(1, int(n**0.5)), num_sub_vectors=64
        )
        return {"index_s": time.perf_counter() - t0}

    def set_knob(self, value: int) -> None:
        self.nprobes = value

    def population(self) -> Query:
        table = self

        def query(q: np.ndarray, k: int) -> list[int]:
            s = table.table.search(q).distance_type("dot").nprobes(table.nprobes).refine_factor(10)
            return s.limit(k).select(["id"]).to_arrow().column("id").to_pylist()

        return query

    def versions(self) -> dict[str, str]:
        import lancedb
        import pyarrow

        return {"lancedb": lancedb.__version__, "pyarrow": pyarrow.__version__}


class Pgvector(System):
    name = "pgvector"
    notes = (
        "PostgreSQL 16 + pgvector 0.6 from pgserver (Unix socket, this machine): table (id, patient, "
        "vector(1024)), btree on patient; patient scope `WHERE patient = p ORDER BY z <#> q LIMIT k` "
        "(exact: measured before the HNSW index exists); population an HNSW index (vector_ip_ops, "
        "m=16, ef_construction=64, the defaults), hnsw.ef_search tuned (at most 1000)"
    )
    knob, knob_values = "hnsw.ef_search", PG_EF_VALUES

    def _connect(self, d: Path) -> Any:
        import psycopg

        from msm_mem._storage.postgres.pgvector import use_schema
        from msm_mem.testing import local_server

        conn = psycopg.connect(local_server(d / "pg"), autocommit=True)
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        use_schema(conn, "public")
        return conn

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        from psycopg.types import TypeInfo

        from msm_mem._storage.postgres.pgvector import Vec

        conn = self._connect(d)
        info = TypeInfo.fetch(conn, "vector")
        assert info is not None
        conn.execute(f"CREATE TABLE items (id int4 PRIMARY KEY, patient int4 NOT NULL, z vector({DIM}) NOT NULL)")
        conn.execute("CREATE INDEX items_patient ON items (patient)")
        t0 = time.perf_counter()  # the rows, not the server's start
        with conn.cursor() as cur:
            for a, b in batches(len(x), 10_000):
                with cur.copy("COPY items (id, patient, z) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(["int4", "int4", info.oid])
                    for i in range(a, b):
                        copy.write_row((i, int(patients[i]), Vec(x[i].tobytes())))
        conn.execute("VACUUM ANALYZE items")
        build_s = time.perf_counter() - t0
        conn.close()
        return {"build_s": build_s}

    def open(self, d: Path) -> None:
        from msm_mem._storage.postgres.pgvector import Vec

        self.conn = self._connect(d)
        self.vec = Vec

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        conn, vec = self.conn, self.vec
        sql = "SELECT id FROM items WHERE patient = %s ORDER BY z <#> %s LIMIT %s"

        def query(q: np.ndarray, p: int, k: int) -> list[int]:
            return [r[0] for r in conn.execute(sql, (p, vec(q.tobytes()), k), prepare=True).fetchall()]

        yield "pgvector `WHERE patient`", query, {}

    def prepare_population(self, d: Path) -> dict[str, float]:
        self.conn.execute("SET maintenance_work_mem = '2GB'")
        t0 = time.perf_counter()
        self.conn.execute("CREATE INDEX items_hnsw ON items USING hnsw (z vector_ip_ops)")
        return {"index_s": time.perf_counter() - t0}

    def set_knob(self, value: int) -> None:
        self.conn.execute(f"SET hnsw.ef_search = {int(value)}")

    def population(self) -> Query:
        conn, vec = self.conn, self.vec
        sql = "SELECT id FROM items ORDER BY z <#> %s LIMIT %s"

        def query(q: np.ndarray, k: int) -> list[int]:
            return [r[0] for r in conn.execute(sql, (vec(q.tobytes()), k), prepare=True).fetchall()]

        return query

    def disk_bytes(self, d: Path) -> int:
        row = self.conn.execute("SELECT pg_total_relation_size('items')").fetchone()
        return int(row[0])

    def versions(self) -> dict[str, str]:
        server = self.conn.execute("SHOW server_version").fetchone()[0]
        ext = self.conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
        return {"postgresql": str(server), "pgvector": str(ext)}

    def close(self) -> None:
        self.conn.close()


def pg_stop(d: Path) -> None:
    """Stop the benchmark's PostgreSQL server of ``d`` (pgserver leaves it running otherwise)."""
    pg_ctl = shutil.which("pg_ctl")
    data = d / "pg"
    if data.is_dir():
        try:
            import pgserver

            binary = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_ctl"
            subprocess.run(
                [str(binary if binary.exists() else pg_ctl), "-D", str(data), "stop", "-m", "fast"],
                capture_output=True,
                check=False,
            )
        except (ImportError, OSError, TypeError):
            pass
