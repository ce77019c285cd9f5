"""What one tenant's store weighs on PostgreSQL: rows and bytes per study of every table,
measured here and scaled to a tenant of ``--scale-patients`` x ``--scale-studies`` (for the
Citus sizing of docs/deploy.md). Sizes are measured, not estimated: a store of
``--patients`` x ``--studies`` ingested studies (the 1024-d ``pixels`` encoder, synthetic
images) with one ask (write-back) per study, on PostgreSQL 16 + pgvector started here
(pgserver), HNSW population indexes on; ``pg_total_relation_size`` of each table (heap,
TOAST, indexes) after ``VACUUM ANALYZE``. Scaling is linear in studies: every table but
``meta`` and ``consents`` (the default policy) grows by rows per study (``keys`` and
``pseudonyms`` per patient). The tables are the store schema's tables with a ``tenant``
column, found in PostgreSQL's catalog.

Usage: python benchmarks/bench_tenant_size.py [--patients 50] [--studies 4]
       [--scale-patients 10000] [--scale-studies 20]
(``--patients 2 --studies 1``: a run of seconds.)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import psycopg
from PIL import Image
from psycopg import sql

from msm_mem import FixedClock, ManifestRow, MsmMem, Principal, Purpose, Role, Settings
from msm_mem.testing import FixedBackbone, local_server

ADMIN = Principal("admin", Role.ADMIN, Purpose.OPERATIONS)
SYSTEM = Principal("ingest", Role.SYSTEM, Purpose.OPERATIONS)
AGENT = Principal("agent", Role.AGENT, Purpose.TREATMENT)
SCHEMA = "msm_mem"
#: the store's tables: those of its schema with a tenant column
TABLES = (
    "SELECT table_name FROM information_schema.columns WHERE table_schema = %s AND column_name = 'tenant' "
    "ORDER BY table_name"
)
T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"
PER_PATIENT = ("keys", "pseudonyms")
#: the store's settings and the default consent policy (rules for every patient): no growth
FIXED = ("meta", "consents")


def _png(folder: Path, seed: int) -> Path:
    path = folder / f"img{seed}.png"
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8), mode="L").save(path)
    return path


def measure(work: Path, url: str, patients: int, studies: int) -> dict[str, tuple[int, int]]:
    """``table -> (rows, bytes)`` of one tenant's store after the workload."""
    settings = Settings(population_search="hnsw", tenant="north")
    mem = MsmMem.init(
        work / "mem",
        ADMIN,
        settings=settings,
        database_url=url,
        schema=SCHEMA,
        clock=FixedClock(T0),
        backbone=FixedBackbone("Right lower lobe opacity, stable", "no change"),
    )
    with mem:
        rows = [
            ManifestRow(f"P{p}", f"S{p}-{s}", T0 - 86400 * s, str(_png(work, p * studies + s)), QUESTION, "effusion")
            for p in range(patients)
            for s in range(studies)
        ]
        mem.ingest(SYSTEM, rows)
        for p in range(patients):
            for s in range(studies):
                image = _png(work, 10_000_000 + p * studies + s)
                mem.ask(AGENT, f"P{p}", image, QUESTION, study_id=f"ACC-{p}-{s}")
    out = {}
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [str(row[0]) for row in conn.execute(TABLES, (SCHEMA,)).fetchall()]
        for table in tables:
            name = sql.Identifier(SCHEMA, table)
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(name))
            count = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE tenant = 'north'").format(name)).fetchone()
            size = conn.execute("SELECT pg_total_relation_size(%s)", (f"{SCHEMA}.{table}",)).fetchone()
            out[table] = (int(count[0]) if count else 0, int(size[0]) if size else 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patients", type=int, default=50)
    parser.add_argument("--studies", type=int, default=4)
    parser.add_argument("--scale-patients", type=int, default=10_000)
    parser.add_argument("--scale-studies", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = local_server(work / "pgdata", delete_at_exit=True)
        sizes = measure(work, url, args.patients, args.studies)
    studies = args.patients * args.studies
    scale_studies = args.scale_patients * args.scale_studies
    print(f"measured: {args.patients} patients x {args.studies} studies, one ask each (1024-d vectors, HNSW on)")
    print(f"scaled to one tenant of {args.scale_patients:,} patients x {args.scale_studies} studies\n")
    print("| table | rows measured | bytes per row | rows per tenant | size per tenant |")
    print("|---|---|---|---|---|")
    total = 0.0
    for table, (count, size) in sorted(sizes.items(), key=lambda kv: -kv[1][1]):
        if table in FIXED:
            rows = float(count)
        elif table in PER_PATIENT:
            rows = count / args.patients * args.scale_patients
        else:
            rows = count / studies * scale_studies
        per_row = size / count if count else 0.0
        scaled = per_row * rows if table not in FIXED else float(size)
        total += scaled
        print(f"| {table} | {count:,} | {per_row:,.0f} | {rows:,.0f} | {scaled / 2**30:,.2f} GiB |")
    print(f"| **all** | | | | **{total / 2**30:,.1f} GiB** |")


if __name__ == "__main__":
    main()
