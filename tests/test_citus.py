"""msm-mem on a real Citus cluster (a coordinator and two workers on loopback ports, started once
per session by tests/conftest.py from the tree `make cluster-build` makes): ``msm-mem init
--database-url`` against the coordinator distributes every table itself, one hospital's
patients land on both workers with all of each patient's rows on one, a patient's search is
routed to a single worker and the population search fans out and merges exactly, rows whose
patient changes are moved between shards, and a small hospital's HNSW search beside a big one
on a shard is not starved (synthetic data only). The store contract and the governed suites
run on the same cluster as the ``citus`` backend (the modules marked ``cluster``);
tests/test_citus_faults.py stops a worker."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem import ManifestRow, MsmMem
from msm_mem._storage.postgres.schema import DISTRIBUTION
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import ADMIN as ADMIN_FLAGS
from tests.helpers import ADMIN, AGENT, AUDITOR, INGEST, SYSTEM, png
from tests.layers import layers_of

pytestmark = [pytest.mark.citus, pytest.mark.system]

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"


def _schema() -> str:
    return f"c{uuid.uuid4().hex[:12]}"


def on_cluster(cluster: Any, directory: Path, schema: str, answer: str = "Stable opacity") -> MsmMem:
    """A new governed store in ``schema`` on the cluster's coordinator, answering ``answer``."""
    return MsmMem.init(
        directory,
        ADMIN,
        database_url=cluster.dsn(),
        schema=schema,
        clock=FixedClock(T0),
        backbone=FixedBackbone(answer, "no change"),
    )


def test_init_on_the_coordinator_distributes_every_table(cluster: Any, tmp_path: Path) -> None:
    """`msm-mem init --database-url <coordinator>` finds the citus extension and distributes
    every table of the store, a patient's tables by the patient and the hospital's own by the
    tenant, all colocated, their shards on both workers; no SQL by hand."""
    schema = _schema()
    rc = main(["init", str(tmp_path / "s"), "--database-url", cluster.dsn(), "--schema", schema, *ADMIN_FLAGS])
    assert rc == 0
    rows = cluster.query(
        "coordinator",
        "SELECT logicalrelid::regclass::text, column_to_column_name(logicalrelid, partkey), colocationid"
        " FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE %s",
        f"{schema}.%",
    )
    assert {r[0]: r[1] for r in rows} == {f"{schema}.{t}": column for t, column in DISTRIBUTION.items()}
    assert {t for t, c in DISTRIBUTION.items() if c == "tenant"} == {"meta", "audit", "pseudonyms"}
    assert len({r[2] for r in rows}) == 1
    ports = cluster.query(
        "coordinator",
        "SELECT DISTINCT n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)"
        " JOIN pg_dist_node n ON n.groupid = p.groupid WHERE s.logicalrelid::regclass::text LIKE %s",
        f"{schema}.%",
    )
    assert sorted(p for (p,) in ports) == sorted(n.port for n in cluster.workers())


#: the hospital's patients in the module's store: enough that both workers hold some
PATIENTS = [f"P-{p}" for p in range(8)]


@pytest.fixture(scope="module")
def governed(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A governed store on the cluster with eight patients' histories ingested, its schema and
    a store handle of its directory."""
    root = tmp_path_factory.mktemp("citus")
    schema = _schema()
    mem = on_cluster(cluster, root / "s", schema)
    rows = [
        ManifestRow(patient, f"S{p}-{i}", T0 - 86400 * i, str(png(root, 10 * p + i)), QUESTION, "effusion")
        for p, patient in enumerate(PATIENTS)
        for i in range(3)
    ]
    mem.ingest(INGEST, rows)
    layers = layers_of(mem, clock=FixedClock(T0))  # the store's own handle: its plans and shards
    yield mem, schema, layers.handle
    layers.close()
    mem.close()


def test_one_hospitals_patients_spread_over_the_workers(cluster: Any, governed: Any) -> None:
    """The coordinator holds no row of the store; the hospital's patients are on both workers;
    every row of one patient (episodes, visuals, semantic state, data key) is in that
    patient's shards on one worker, and the other worker has none of them."""
    _, schema, _ = governed
    on: dict[str, set[str]] = {}
    for patient in PATIENTS:
        worker, _ = cluster.shard_of(f"{schema}.episodic", patient)
        on.setdefault(worker, set()).add(patient)
        for table, column in (
            ("episodic", "patient_id"),
            ("visual", "patient_id"),
            ("semantic", "patient_id"),
            ("keys", "patient_ref"),
        ):
            here, shard = cluster.shard_of(f"{schema}.{table}", patient)
            assert here == worker, (patient, table)
            ((count,),) = cluster.query(worker, f"SELECT count(*) FROM {shard} WHERE {column} = %s", patient)
            ((total,),) = cluster.query(
                "coordinator", f"SELECT count(*) FROM {schema}.{table} WHERE {column} = %s", patient
            )
            assert count == total > 0, (patient, table)
    assert set(on) == {n.name for n in cluster.workers()}, on
    ((local,),) = cluster.query(
        "coordinator",
        "SELECT count(*) FROM citus_shards WHERE nodeport = %s AND table_name::text LIKE %s",
        cluster.nodes["coordinator"].port,
        f"{schema}.%",
    )
    assert local == 0


def test_a_patients_search_touches_one_worker_and_the_population_fans_out(cluster: Any, governed: Any) -> None:
    """EXPLAIN of a patient-scoped search is a Citus router plan, one task on the worker that
    holds the patient's shard; the hospital's population search is one task per shard (every
    worker), merged on the coordinator."""
    _, schema, store = governed
    z = np.full(store.dim, 1 / np.sqrt(store.dim), dtype=np.float32)
    plan = store.explain_search("episodic", z, 5, "P-1")
    assert "Task Count: 1" in plan, plan
    worker, _ = cluster.shard_of(f"{schema}.episodic", "P-1")
    assert f"port={cluster.nodes[worker].port}" in plan, plan
    plan = store.explain_search("episodic", z, 5, None)
    assert f"Task Count: {cluster.shards}" in plan, plan


def test_the_population_search_merges_the_shards_exactly(governed: Any) -> None:
    """The hospital's population search over the shards returns the exact top k of all its
    patients' rows (recall@10 of 1 against the scores computed here)."""
    _, _, store = governed
    rows = [(e.episode_id, e.z) for e in store.iter_episodes() if e.state.value in ("active", "anonymized")]
    rng = np.random.default_rng(5)
    for _ in range(5):
        q = rng.standard_normal(store.dim).astype(np.float32)
        q /= np.linalg.norm(q)
        truth = sorted(rows, key=lambda r: -float(np.dot(r[1], q)))[:10]
        hits = store.search("episodic", q, 10, None)
        assert [i for i, _ in hits] == [i for i, _ in truth]


def test_the_audit_chain_verifies_on_the_cluster(governed: Any) -> None:
    """The tenant's audit chain, written through the coordinator while the patients' rows go
    to their own shards (two-phase commits across the workers), verifies."""
    mem, _, _ = governed
    for patient in PATIENTS[:4]:
        mem.ask(AGENT, patient, png(Path(mem.directory), 99), QUESTION, study_id=f"ACC-{patient}")
    assert mem.verify_audit(AUDITOR).ok


def test_shredding_moves_the_key_to_its_tombstones_shard(cluster: Any, governed: Any) -> None:
    """A shredded patient leaves no row under its id on any shard: its records are emptied and
    its data key's row is replaced by one tombstone (Citus cannot update the distribution
    column, so the row is deleted and the tombstone written under its own reference); the chain
    verifies after."""
    mem, schema, store = governed
    patient = PATIENTS[-1]
    shredded = f"SELECT count(*) FROM {schema}.keys WHERE shredded"
    ((before,),) = cluster.query("coordinator", shredded)
    mem.shred(ADMIN, patient, reason="erasure request")
    for table, column in (("episodic", "patient_id"), ("visual", "patient_id"), ("keys", "patient_ref")):
        ((left,),) = cluster.query("coordinator", f"SELECT count(*) FROM {schema}.{table} WHERE {column} = %s", patient)
        assert left == 0, table
    ((after,),) = cluster.query("coordinator", shredded)
    assert after == before + 1
    assert store.record_ids("episodic", patient) == []
    assert mem.verify_audit(AUDITOR).ok


def test_decay_moves_anonymised_rows_to_the_pools_shard(cluster: Any, tmp_path: Path) -> None:
    """Maintenance past the retention anonymises a patient's rows in place on one server; on
    the cluster each row is moved (copied under its new id to the shard of the anonymised
    pool, then deleted) because Citus does not update a distribution column. Every row is
    anonymised once, none is left on the patient's shard, it keeps its position, and the
    chain and row digests verify."""
    schema = _schema()
    mem = on_cluster(cluster, tmp_path / "s", schema)
    rows = [
        ManifestRow("P-old", f"S{i}", T0 - 86400 * i, str(png(tmp_path, i)), QUESTION, "effusion") for i in range(3)
    ]
    mem.ingest(INGEST, rows)
    positions = sorted(cluster.query("coordinator", f"SELECT pos FROM {schema}.episodic WHERE patient_id = 'P-old'"))
    report = mem.maintain(SYSTEM, at=T0 + 200 * 365 * 86400)
    assert report.anonymized >= 3
    for table in ("episodic", "visual", "semantic", "claims"):
        ((left,),) = cluster.query(
            "coordinator", f"SELECT count(*) FROM {schema}.{table} WHERE patient_id = 'P-old' AND state = 'active'"
        )
        assert left == 0, table
    moved = cluster.query(
        "coordinator", f"SELECT pos FROM {schema}.episodic WHERE patient_id = '' AND state = 'anonymized' ORDER BY pos"
    )
    assert sorted(moved) == positions
    worker, shard = cluster.shard_of(f"{schema}.episodic", "")
    ((there,),) = cluster.query(worker, f"SELECT count(*) FROM {shard} WHERE state = 'anonymized'")
    assert there == len(positions)
    assert mem.verify_audit(AUDITOR).ok
    mem.close()


def _sharing_a_shard(cluster: Any, table: str, n: int) -> list[str]:
    """``n`` patient ids whose rows of ``table`` share one shard."""
    first, found = cluster.shard_of(table, "p0"), ["p0"]
    for i in range(1, 2000):
        if len(found) == n:
            return found
        if cluster.shard_of(table, f"p{i}") == first:
            found.append(f"p{i}")
    raise AssertionError(f"fewer than {n} patient ids share a shard")


@pytest.mark.slow
def test_a_small_tenants_hnsw_search_is_not_starved_by_a_big_one(cluster: Any) -> None:
    """HNSW population search of a tenant with a tenth of a shard's rows (the worker plans it
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
    small_name = "small"
    small = with_codec(
        PostgresStore.create(
            cluster.dsn(), dim=DIM, encoder="t", schema=schema, tenant=small_name, population_search="hnsw"
        )
    )
    rng = np.random.default_rng(3)
    from msm_mem._storage.base import WriteBatch

    # every patient of both hospitals on one shard: the small hospital is a tenth of its index
    patients = _sharing_a_shard(cluster, f"{schema}.episodic", 10)
    big.write(WriteBatch(episodes=[episode(i, patients[i % 7], random_unit(rng)) for i in range(5000)]))
    small.write(WriteBatch(episodes=[episode(i, patients[7 + i % 3], random_unit(rng)) for i in range(500)]))
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
