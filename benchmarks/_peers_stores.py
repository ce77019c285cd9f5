"""The databases `bench_peers.py` compares: Chroma, LanceDB and pgvector (see `_peers_systems.py`
for the contract every system follows)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _peers_systems import DIM, NPROBES, PG_EF_VALUES, PatientQuery, Query, System, batches


class Vector:
    """A float32 vector as pgvector's binary form (``int16 dim, int16 0``, big-endian float4)."""

    __slots__ = ("blob",)

    def __init__(self, z: np.ndarray) -> None:
        self.blob = struct.pack(">HH", len(z), 0) + z.astype(">f4").tobytes()


def register_vector(conn: Any) -> int:
    """Send :class:`Vector` as pgvector's ``vector`` on ``conn`` (binary); the type's oid."""
    from psycopg.adapt import Buffer, Dumper
    from psycopg.pq import Format
    from psycopg.types import TypeInfo

    info = TypeInfo.fetch(conn, "vector")
    assert info is not None, "the pgvector extension is not installed"

    class VectorDumper(Dumper):
        format = Format.BINARY
        oid = info.oid

        def dump(self, obj: Vector) -> Buffer:
            return obj.blob

    conn.adapters.register_dumper(Vector, VectorDumper)
    return int(info.oid)


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
            ids: list[int] = s.to_arrow().column("id").to_pylist()
            return ids

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
            ids: list[int] = s.limit(k).select(["id"]).to_arrow().column("id").to_pylist()
            return ids

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

        from msm_mem.testing import local_server

        conn = psycopg.connect(local_server(d / "pg"), autocommit=True)
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        self.oid = register_vector(conn)
        return conn

    def build(self, d: Path, x: np.ndarray, patients: np.ndarray) -> dict[str, float]:
        conn = self._connect(d)
        conn.execute(f"CREATE TABLE items (id int4 PRIMARY KEY, patient int4 NOT NULL, z vector({DIM}) NOT NULL)")
        conn.execute("CREATE INDEX items_patient ON items (patient)")
        t0 = time.perf_counter()  # the rows, not the server's start
        with conn.cursor() as cur:
            for a, b in batches(len(x), 10_000):
                with cur.copy("COPY items (id, patient, z) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(["int4", "int4", self.oid])
                    for i in range(a, b):
                        copy.write_row((i, int(patients[i]), Vector(x[i])))
        conn.execute("VACUUM ANALYZE items")
        build_s = time.perf_counter() - t0
        conn.close()
        return {"build_s": build_s}

    def open(self, d: Path) -> None:
        self.conn = self._connect(d)

    def patient_variants(self, d: Path) -> Iterator[tuple[str, PatientQuery, dict[str, float]]]:
        conn = self.conn
        sql = "SELECT id FROM items WHERE patient = %s ORDER BY z <#> %s LIMIT %s"

        def query(q: np.ndarray, p: int, k: int) -> list[int]:
            return [r[0] for r in conn.execute(sql, (p, Vector(q), k), prepare=True).fetchall()]

        yield "pgvector `WHERE patient`", query, {}

    def prepare_population(self, d: Path) -> dict[str, float]:
        self.conn.execute("SET maintenance_work_mem = '2GB'")
        t0 = time.perf_counter()
        self.conn.execute("CREATE INDEX items_hnsw ON items USING hnsw (z vector_ip_ops)")
        return {"index_s": time.perf_counter() - t0}

    def set_knob(self, value: int) -> None:
        self.conn.execute(f"SET hnsw.ef_search = {int(value)}")

    def population(self) -> Query:
        conn = self.conn
        sql = "SELECT id FROM items ORDER BY z <#> %s LIMIT %s"

        def query(q: np.ndarray, k: int) -> list[int]:
            return [r[0] for r in conn.execute(sql, (Vector(q), k), prepare=True).fetchall()]

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
