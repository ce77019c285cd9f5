"""Tenants: several stores in the tables of one PostgreSQL schema, each fully separate (its own
meta, audit chain and checkpoints, keys and rows); what one tenant does is never read, changed,
shredded or verified by another. A tenant's name is validated wherever it comes in; a store
directory opens as its own tenant only. On a real PostgreSQL started by the tests, and on the
embedded store (synthetic data only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from msm_mem import InvalidInput, ManifestRow, MsmMem, StoreError
from msm_mem._settings import Settings
from msm_mem._storage.base import Store
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import ADMIN as ADMIN_FLAGS
from tests.cli_support import clean_env, run
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, SYSTEM, png, raw_sql
from tests.layers import layers_of

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"
BAD_TENANTS = ["", "two words", "semi;colon", "dots.too", "x" * 64, "ümlaut", 7]


def _open(directory: Path) -> MsmMem:
    return MsmMem.open(directory, clock=FixedClock(T0 + 3600), backbone=FixedBackbone("Stable opacity", "no change"))


def _fill(mem: MsmMem, tmp_path: Path, seed: int) -> None:
    rows = [
        ManifestRow("P-1", f"S{seed}-{i}", T0 - 86400 * i, str(png(tmp_path, seed + i)), QUESTION, "effusion")
        for i in range(3)
    ]
    mem.ingest(SYSTEM, rows)


def _snapshot(mem: MsmMem) -> dict[str, Any]:
    """What a tenant's store holds of itself, read around the governed API (a governed read
    would add its own audit event): records, chain, checkpoints, keys, row digests."""
    with layers_of(mem) as layers:
        return _held(layers.store, mem.directory / "audit")


def _held(store: Store, audit: Path) -> dict[str, Any]:
    episodes = store.get_episodes(store.record_ids("episodic", "P-1"))
    return {
        "episodes": [(e.episode_id, e.answer, e.state) for e in episodes],
        "claims": [(c.claim_id, c.content) for c in store.claims_active("P-1")],
        "head": store.audit_head(),
        "digests": store.row_digests(),
        "keys": [(k.key_id, k.shredded) for k in store.keys().all()],
        "checkpoints": sorted((p.name, p.read_bytes()) for p in audit.iterdir() if p.is_file()),
    }


@pytest.mark.postgres
def test_two_tenants_in_one_schema_are_separate_stores(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    """Tenants north and south-2 share one schema and one patient id: ask, feedback and shred in
    north leave south-2's records, audit chain, checkpoints, keys and row digests exactly as
    they were, and each chain verifies on its own, numbered from 1 and gapless."""
    stores = {}
    for tenant, seed in (("north", 0), ("south-2", 10)):
        settings = Settings(tenant=tenant)
        options = {"database_url": postgres_url, "schema": pg_schema, "clock": FixedClock(T0)}
        mem = MsmMem.init(tmp_path / tenant, ADMIN, settings=settings, **options)
        _fill(mem, tmp_path, seed)
        mem.close()
        spec = json.loads((tmp_path / tenant / "store.json").read_text(encoding="utf-8"))
        assert spec["schema"] == pg_schema and spec["tenant"] == tenant
        stores[tenant] = tmp_path / tenant
    with _open(stores["south-2"]) as south:
        assert south.tenant == "south-2"
        before = _snapshot(south)
    with _open(stores["north"]) as north:
        north.ask(AGENT, "P-1", png(tmp_path, 50), QUESTION, study_id="ACC-50")
        north.feedback(CLINICIAN, "P-1", "ACC-50", accept=False, correction="New left effusion")
        north.shred(ADMIN, "P-1", "erasure request")
        assert north.verify_audit(AUDITOR).ok
        with layers_of(north) as layers:
            assert layers.store.computed_row_digests() == layers.store.row_digests()
            north_head = layers.store.audit_head()[0]
    with _open(stores["south-2"]) as south:
        assert _snapshot(south) == before
        assert [e.answer for e in south.episodes(CLINICIAN, "P-1")] == [a for _, a, _ in before["episodes"]]
        result = south.verify_audit(AUDITOR)  # its own read and verify events continue its chain
        with layers_of(south) as layers:
            assert result.ok and result.count == layers.store.audit_head()[0] > before["head"][0]
            assert layers.store.computed_row_digests() == layers.store.row_digests()
            south_head = layers.store.audit_head()[0]
    with psycopg.connect(postgres_url) as conn:
        seqs = dict(
            conn.execute(
                f'SELECT tenant, array_agg(seq ORDER BY seq) FROM "{pg_schema}".audit GROUP BY tenant'
            ).fetchall()
        )
        tenants = {r[0] for r in conn.execute(f'SELECT DISTINCT tenant FROM "{pg_schema}".episodic').fetchall()}
    assert seqs["north"] == list(range(1, north_head + 1))
    assert seqs["south-2"] == list(range(1, south_head + 1))
    assert tenants == {"north", "south-2"}


@pytest.mark.postgres
def test_a_tenant_is_opened_only_by_its_own_directory(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    """A second store of a tenant in the same schema is refused; a directory opened as another
    tenant is refused; a failed init of a new tenant removes its rows only."""
    options = {"database_url": postgres_url, "schema": pg_schema}
    MsmMem.init(tmp_path / "a", ADMIN, settings=Settings(tenant="a"), **options).close()
    with pytest.raises(StoreError, match="already holds a store of tenant 'a'"):
        MsmMem.init(tmp_path / "a2", ADMIN, settings=Settings(tenant="a"), **options)
    with pytest.raises(InvalidInput, match="tenant 'a', not 'b'"):
        MsmMem.open(tmp_path / "a", tenant="b")
    with pytest.raises(InvalidInput):
        MsmMem.init(tmp_path / "b", ADMIN, settings=Settings(tenant="b"), policy=["not a consent"], **options)  # type: ignore[list-item]
    assert not (tmp_path / "b").exists()
    with MsmMem.open(tmp_path / "a", tenant="a") as again:
        assert again.verify_audit(AUDITOR).ok
    with psycopg.connect(postgres_url) as conn:
        left = conn.execute(f'SELECT DISTINCT tenant FROM "{pg_schema}".meta').fetchall()
    assert left == [("a",)]


@pytest.mark.parametrize("bad", BAD_TENANTS)
def test_a_bad_tenant_name_is_refused(tmp_path: Path, bad: object) -> None:
    """A tenant that is not 1 to 63 ASCII letters, digits, - or _ is InvalidInput, in the
    settings, the environment, opening and a store.json, and nothing is made."""
    with pytest.raises(InvalidInput, match="tenant"):
        Settings(tenant=bad)  # type: ignore[arg-type]
    if isinstance(bad, str):
        with pytest.raises(InvalidInput, match="MSM_MEM_TENANT|tenant"):
            Settings.from_env({"MSM_MEM_TENANT": bad})
    MsmMem.init(tmp_path / "s", ADMIN).close()
    with pytest.raises(InvalidInput, match="tenant"):
        MsmMem.open(tmp_path / "s", tenant=bad)  # type: ignore[arg-type]
    (tmp_path / "pg").mkdir()
    spec = {"backend": "postgresql", "dsn": "host=nowhere", "schema": "msm_mem", "tenant": bad}
    (tmp_path / "pg" / "store.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises((StoreError, InvalidInput), match="tenant"):
        MsmMem.open(tmp_path / "pg")


def test_an_embedded_store_carries_its_tenant_in_every_row(tmp_path: Path) -> None:
    """An embedded store made for tenant ward-7 has it in every row of every table, opens as
    ward-7 and is refused as another."""
    mem = MsmMem.init(tmp_path / "s", ADMIN, settings=Settings(tenant="ward-7"), clock=FixedClock(T0))
    _fill(mem, tmp_path, 0)
    mem.ask(AGENT, "P-1", png(tmp_path, 20), QUESTION, study_id="ACC-20")
    mem.close()
    tables = [t for (t,) in raw_sql(tmp_path / "s", "SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        assert raw_sql(tmp_path / "s", f"SELECT count(*) FROM {table} WHERE tenant IS NOT 'ward-7'") == [(0,)]
    assert raw_sql(tmp_path / "s", "SELECT count(*) FROM episodic WHERE tenant = 'ward-7'") == [(3,)]
    with _open(tmp_path / "s") as again:
        assert again.tenant == "ward-7"
        assert again.verify_audit(AUDITOR).ok
    with pytest.raises(InvalidInput, match="tenant 'ward-7', not 'default'"):
        MsmMem.open(tmp_path / "s", tenant="default")


def test_the_cli_makes_and_checks_the_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """init --tenant makes the store of that tenant; MSM_MEM_TENANT naming another makes later
    commands fail with one clear line; a bad --tenant fails init and leaves nothing."""
    clean_env(monkeypatch)
    rc, _, err = run(capsys, "init", tmp_path / "bad", "--tenant", "no spaces", *ADMIN_FLAGS)
    assert rc == 1 and "tenant" in err and not (tmp_path / "bad").exists()
    rc, _, err = run(capsys, "init", tmp_path / "s", "--tenant", "icu", *ADMIN_FLAGS)
    assert rc == 0, err
    with MsmMem.open(tmp_path / "s") as mem:
        assert mem.tenant == "icu"
    monkeypatch.setenv("MSM_MEM_TENANT", "ward")
    rc, _, err = run(capsys, "audit", "verify", tmp_path / "s", "--actor", "aud-1", "--role", "auditor")
    assert rc == 1 and "tenant 'icu', not 'ward'" in err
    monkeypatch.setenv("MSM_MEM_TENANT", "icu")
    rc, _, err = run(capsys, "audit", "verify", tmp_path / "s", "--actor", "aud-1", "--role", "auditor")
    assert rc == 0, err
