"""msm-mem on a real Citus cluster (a coordinator and two workers on loopback ports, started once
per session by tests/conftest.py from the tree `make cluster-build` makes): ``msm-mem init
--database-url`` against the coordinator distributes every table itself, the rows land on the
workers, one patient's retrieval is routed to a single worker, and a small hospital's HNSW
search beside a big one on its shard is not starved (synthetic data only). The store contract
and the governed suites run on the same cluster as the ``citus`` backend (the modules marked
``cluster``); tests/test_citus_faults.py stops a worker."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem import ManifestRow, MsmMem
from msm_mem._storage.postgres.schema import TABLES
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import ADMIN as ADMIN_FLAGS
from tests.helpers import ADMIN, AGENT, AUDITOR, INGEST, png

pytestmark = [pytest.mark.citus, pytest.mark.system]

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"


def _schema() -> str:
    return f"c{uuid.uuid4().hex[:12]}"


def _placements(cluster: Any, schema: str, table: str, tenant: str) -> tuple[str, str]:
    """The worker holding ``tenant``'s shard of ``table`` and that shard's name."""
    ((shard,),) = cluster.query(
        "coordinator",
        "SELECT get_shard_id_for_distribution_column(%s::regclass, %s::text)",
        f"{schema}.{table}",
        tenant,
    )
    ((port,),) = cluster.query(
        "coordinator",
        "SELECT nodeport FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid WHERE shardid = %s",
        shard,
    )
    worker = next(n.name for n in cluster.workers() if n.port == port)
    return worker, f"{schema}.{table}_{shard}"


def test_init_on_the_coordinator_distributes_every_table(cluster: Any, tmp_path: Path) -> None:
    """`msm-mem init --database-url <coordinator>` finds the citus extension and distributes
    every table of the store by tenant, all colocated, their shards on both workers; no SQL by hand."""
    schema = _schema()
    rc = main(["init", str(tmp_path / "s"), "--database-url", cluster.dsn(), "--schema", schema, *ADMIN_FLAGS])
    assert rc == 0
    rows = cluster.query(
        "coordinator",
        "SELECT logicalrelid::regclass::text, column_to_column_name(logicalrelid, partkey), colocationid"
        " FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE %s",
        f"{schema}.%",
    )
    assert sorted(r[0] for r in rows) == sorted(f"{schema}.{t}" for t in TABLES)
    assert {r[1] for r in rows} == {"tenant"} and len({r[2] for r in rows}) == 1
    ports = cluster.query(
        "coordinator",
        "SELECT DISTINCT n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)"
        " JOIN pg_dist_node n ON n.groupid = p.groupid WHERE s.logicalrelid::regclass::text LIKE %s",
        f"{schema}.%",
    )
    assert sorted(p for (p,) in ports) == sorted(n.port for n in cluster.workers())


@pytest.fixture(scope="module")
def governed(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A governed store on the cluster with two patients' histories ingested."""
    root = tmp_path_factory.mktemp("citus")
    schema = _schema()
    mem = MsmMem.init(
        root / "s",
        ADMIN,
        database_url=cluster.dsn(),
        schema=schema,
        clock=FixedClock(T0),
        backbone=FixedBackbone("Stable opacity", "no change"),
    )
    rows = [
        ManifestRow(f"P-{p}", f"S{p}-{i}", T0 - 86400 * i, str(png(root, 10 * p + i)), QUESTION, "effusion")
        for p in range(2)
        for i in range(4)
    ]
    mem.ingest(INGEST, rows)
    yield mem, schema
    mem.close()


def test_the_rows_live_on_the_tenants_worker(cluster: Any, governed: Any) -> None:
    """The coordinator holds no row of the store: the tenant's episodes are in its shard of
    `episodic` on one worker, and the other worker has none of them."""
    mem, schema = governed
    worker, shard = _placements(cluster, schema, "episodic", mem.tenant)
    ((on_worker,),) = cluster.query(worker, f"SELECT count(*) FROM {shard}")
    ((through_coordinator,),) = cluster.query("coordinator", f"SELECT count(*) FROM {schema}.episodic")
    assert on_worker == through_coordinator == 8
    ((local,),) = cluster.query(
        "coordinator",
        "SELECT count(*) FROM citus_shards WHERE nodeport = %s AND table_name::text LIKE %s",
        cluster.nodes["coordinator"].port,
        f"{schema}.%",
    )
    assert local == 0


@pytest.mark.parametrize("scope", ["P-1", None])
def test_a_patients_search_is_routed_to_one_worker(cluster: Any, governed: Any, scope: str | None) -> None:
    """EXPLAIN of a patient-scoped search (and of the tenant's population search) is a Citus
    router plan: one task, on the worker that holds the tenant's shard group."""
    mem, schema = governed
    z = np.full(mem._store.dim, 1 / np.sqrt(mem._store.dim), dtype=np.float32)
    plan = mem._store.explain_search("episodic", z, 5, scope)
    assert "Task Count: 1" in plan, plan
    worker, _ = _placements(cluster, schema, "episodic", mem.tenant)
    assert f"port={cluster.nodes[worker].port}" in plan, plan


def test_the_audit_chain_verifies_on_the_cluster(governed: Any) -> None:
    """The tenant's audit chain, written through the coordinator, verifies."""
    mem, _ = governed
    mem.ask(AGENT, "P-1", png(Path(mem.directory), 99), QUESTION, study_id="ACC-9")
    assert mem.verify_audit(AUDITOR).ok


def _same_shard_tenants(cluster: Any, schema: str, first: str) -> str:
    """A tenant name whose rows share ``first``'s shard group."""
    (target,) = cluster.query(
        "coordinator", "SELECT get_shard_id_for_distribution_column(%s::regclass, %s::text)", f"{schema}.meta", first
    )[0]
    for i in range(1000):
        name = f"small{i}"
        if cluster.query(
            "coordinator", "SELECT get_shard_id_for_distribution_column(%s::regclass, %s::text)", f"{schema}.meta", name
        ) == [(target,)]:
            return name
    raise AssertionError("no tenant name shares the shard")


@pytest.mark.slow
def test_a_small_tenants_hnsw_search_is_not_starved_by_a_big_one(cluster: Any) -> None:
    """HNSW population search of a tenant with a tenth of its shard's rows (the worker plans it
    on the HNSW index, filtered by tenant): with pgvector 0.8's iterative scan, passed on to
    the worker, it returns 10 hits at recall@10 >= 0.9 against the exact search; without it the
    filtered scan runs out of candidates and returns fewer."""
    from msm_mem._storage.postgres import PostgresStore
    from tests.conftest import DIM, random_unit, with_codec
    from tests.test_store_contract import episode

    schema = _schema()
    big = with_codec(
        PostgresStore.create(cluster.dsn(), dim=DIM, encoder="t", schema=schema, tenant="big", population_search="hnsw")
    )
    small_name = _same_shard_tenants(cluster, schema, "big")
    small = with_codec(
        PostgresStore.create(
            cluster.dsn(), dim=DIM, encoder="t", schema=schema, tenant=small_name, population_search="hnsw"
        )
    )
    rng = np.random.default_rng(3)
    from msm_mem._storage.base import WriteBatch

    big.write(WriteBatch(episodes=[episode(i, f"b{i % 7}", random_unit(rng)) for i in range(5000)]))
    small.write(WriteBatch(episodes=[episode(i, f"s{i % 3}", random_unit(rng)) for i in range(500)]))
    cluster.query("coordinator", f"ANALYZE {schema}.episodic")
    assert small._vectors.iterative
    queries = [random_unit(rng) for _ in range(10)]
    exact = PostgresStore.open(cluster.dsn(), schema=schema, tenant=small_name)
    try:
        found = 0
        for z in queries:
            truth = {i for i, _ in exact.search("episodic", z, 10, None)}
            hits = [i for i, _ in small.search("episodic", z, 10, None)]
            assert len(hits) == 10
            found += len(truth & set(hits))
        assert found / (10 * len(queries)) >= 0.9  # recall@10 against the exact search
        small._vectors.iterative = False
        starved = [len(small.search("episodic", z, 10, None)) for z in queries]
        assert min(starved) < 10, starved
    finally:
        for store in (exact, small, big):
            store.close()
