"""A store of schema 2 (before tenants) is refused, naming the upgrade; ``msm-mem store upgrade``
gives every table the tenant column in one transaction (SQLite rebuilds the tables, PostgreSQL
alters them), every row the store's tenant's, audited, an admin's only; the upgraded store has
the catalog of a new one, keeps every record and verifies; a SIGKILL inside the upgrade leaves
the schema-2 store as it was. The old layout is made by SQL (tests/legacy_layout.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from msm_mem import AccessDenied, InvalidInput, ManifestRow, MsmMem, StoreError
from msm_mem._settings import Settings
from msm_mem._storage.base import Store
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, SYSTEM, audit_events, png, raw_db, raw_sql
from tests.layers import layers_of
from tests.legacy_layout import to_schema_2

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"


def _v2_store(tmp_path: Path, new_mem: MemFactory, name: str = "old", **options: Any) -> tuple[Path, dict[str, Any]]:
    """A closed store with records of two patients (one shredded) in the schema-2 layout, and
    what it holds (read around the governed API)."""
    mem = new_mem(name, clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "follow up"), **options)
    rows = [
        ManifestRow(f"P-{i % 2}", f"S{i}", T0 - 86400 * i, str(png(tmp_path, i)), QUESTION, "effusion", view="PA")
        for i in range(4)
    ]
    mem.ingest(SYSTEM, rows)
    mem.ask(AGENT, "P-0", png(tmp_path, 9), QUESTION, study_id="ACC-9")
    mem.shred(ADMIN, "P-1", "erasure request")
    held = _held(mem)
    directory = mem.directory
    mem.close()
    to_schema_2(directory)
    return directory, held


def _held(mem: MsmMem) -> dict[str, Any]:
    with layers_of(mem) as layers:
        return _records(layers.store)


def _records(store: Store) -> dict[str, Any]:
    return {
        "episodes": [
            (e.episode_id, e.answer, e.state) for e in store.get_episodes(store.record_ids("episodic", "P-0"))
        ],
        "visuals": [(v.visual_id, v.visual_tag) for v in store.get_visuals(store.record_ids("visual", "P-0"))],
        "claims": [(c.claim_id, c.content) for c in store.claims_active("P-0")],
        "keys": [(k.key_id, k.shredded) for k in store.keys().all()],
        "count": store.count("episodic"),
    }


def _has_tenant(directory: Path) -> bool:
    with raw_db(directory) as db:
        if db.backend == "sqlite":
            return any(r[1] == "tenant" for r in db.execute("PRAGMA table_info(audit)").fetchall())
        found = db.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = 'audit' AND column_name = 'tenant'"
        ).fetchone()
        return bool(found[0])


def _still_v2(directory: Path) -> None:
    with pytest.raises(StoreError, match="before tenants.*msm-mem store upgrade"):
        MsmMem.open(directory)
    assert not _has_tenant(directory)
    assert raw_sql(directory, "SELECT value FROM meta WHERE key = 'schema'") == [("2",)]


def _catalog(directory: Path) -> dict[str, Any]:
    """The layout of a store's tables: columns in order, keys and indexes (their definitions)."""
    with raw_db(directory) as db:
        out: dict[str, Any] = {}
        for table in db.tables():
            if db.backend == "sqlite":
                columns = [tuple(r[1:]) for r in db.execute(f"PRAGMA table_info({table})").fetchall()]
                indexes = sorted(
                    (bool(u), bool(p), tuple(c[2] for c in db.execute(f"PRAGMA index_info({n})").fetchall()))
                    for _, n, u, _, p in db.execute(f"PRAGMA index_list({table})").fetchall()
                )
            else:
                columns = db.execute(
                    "SELECT column_name, data_type, is_nullable, collation_name FROM information_schema.columns"
                    " WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
                    (table,),
                ).fetchall()
                indexes = sorted(
                    r[0].replace(f"{db.location.schema}.", "")  # type: ignore[union-attr]
                    for r in db.execute(
                        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = ?::regclass", (table,)
                    ).fetchall()
                )
            out[table] = (columns, indexes)
        return out


def test_a_schema_2_store_is_refused_naming_the_upgrade(tmp_path: Path, new_mem: MemFactory) -> None:
    """Opening it fails with the command that upgrades it; nothing changes; only an admin upgrades."""
    directory, _ = _v2_store(tmp_path, new_mem)
    _still_v2(directory)
    for who in (AUDITOR, SYSTEM, CLINICIAN, AGENT):
        with pytest.raises(AccessDenied):
            MsmMem.upgrade(directory, who)
    _still_v2(directory)


def test_the_upgrade_gives_every_row_the_tenant(tmp_path: Path, new_mem: MemFactory, backend: str) -> None:
    """Schema 2 to 3: every row of every table the store's tenant's, the catalog a new store's,
    every record kept, the audited upgrade event appended, the chain and row digests verifying;
    writes go on and a second upgrade has nothing to do."""
    directory, held = _v2_store(tmp_path, new_mem)
    fresh = new_mem("fresh")
    fresh.close()
    events = int(raw_sql(directory, "SELECT max(seq) FROM audit")[0][0])
    result = MsmMem.upgrade(directory, ADMIN)
    assert result == {
        "from_schema": 2,
        "to_schema": 3,
        "visual_tags_encrypted": 0,
        "events_signed": events + 1,
        "keys_moved": 2,
    }
    with raw_db(directory) as db:
        for table in db.tables():
            assert db.execute(f"SELECT count(*) FROM {table} WHERE tenant <> 'default'").fetchone()[0] == 0
    assert raw_sql(directory, "SELECT count(*) FROM meta WHERE key = 'tenant'") == [(0,)]
    assert _catalog(directory) == _catalog(fresh.directory)
    with MsmMem.open(directory, clock=FixedClock(T0 + 60)) as mem:
        assert mem.tenant == "default"
        assert _held(mem) == held
        with layers_of(mem) as layers:
            assert layers.store.computed_row_digests() == layers.store.row_digests()
        upgrades = [e for e in audit_events(mem) if e.action == "store_upgrade"]
        assert [(e.seq, e.actor, e.reason) for e in upgrades] == [(events + 1, ADMIN.id, "store schema 2 to 3")]
        assert mem.verify_audit(AUDITOR).ok
        mem.ask(AGENT, "P-0", png(tmp_path, 10), QUESTION, study_id="ACC-10")
        assert [v.visual_tag for v in mem.visuals(CLINICIAN, "P-0")][:2] == ["PA", "PA"]
        assert mem.verify_audit(AUDITOR).ok
    with pytest.raises(StoreError, match="nothing to upgrade"):
        MsmMem.upgrade(directory, ADMIN)


def test_an_embedded_store_is_upgraded_to_a_named_tenant(tmp_path: Path) -> None:
    """``tenant`` names whose rows an embedded store's become; it opens as that tenant after."""
    mem = MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(T0))
    mem.ingest(SYSTEM, [ManifestRow("P-0", "S0", T0, str(png(tmp_path, 0)), QUESTION, "effusion")])
    mem.close()
    to_schema_2(tmp_path / "s")
    with pytest.raises(InvalidInput, match="tenant"):
        MsmMem.upgrade(tmp_path / "s", ADMIN, tenant="not valid")
    _still_v2(tmp_path / "s")
    MsmMem.upgrade(tmp_path / "s", ADMIN, tenant="ward-7")
    assert raw_sql(tmp_path / "s", "SELECT DISTINCT tenant FROM episodic") == [("ward-7",)]
    with MsmMem.open(tmp_path / "s", tenant="ward-7") as again:
        assert again.verify_audit(AUDITOR).ok


@pytest.mark.postgres
def test_a_server_store_is_upgraded_to_its_store_json_tenant(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    """A PostgreSQL store's rows become the tenant its store.json names (edited before the
    upgrade; absent: "default"); no other tenant is made in the old schema before the upgrade."""
    mem = MsmMem.init(tmp_path / "s", ADMIN, database_url=postgres_url, schema=pg_schema, clock=FixedClock(T0))
    mem.ingest(SYSTEM, [ManifestRow("P-0", "S0", T0, str(png(tmp_path, 0)), QUESTION, "effusion")])
    mem.close()
    to_schema_2(tmp_path / "s")
    location = tmp_path / "s" / "store.json"
    spec = json.loads(location.read_text(encoding="utf-8"))
    del spec["tenant"]  # as schema 2 wrote it
    location.write_text(json.dumps({**spec, "tenant": "east"}), encoding="utf-8")
    with pytest.raises(StoreError, match="older msm-mem: upgrade it"):
        MsmMem.init(
            tmp_path / "other", ADMIN, settings=Settings(tenant="west"), database_url=postgres_url, schema=pg_schema
        )
    with pytest.raises(InvalidInput, match="tenant 'east', not 'west'"):
        MsmMem.upgrade(tmp_path / "s", ADMIN, tenant="west")
    MsmMem.upgrade(tmp_path / "s", ADMIN)
    assert raw_sql(tmp_path / "s", "SELECT DISTINCT tenant FROM audit") == [("east",)]
    MsmMem.init(
        tmp_path / "other", ADMIN, settings=Settings(tenant="west"), database_url=postgres_url, schema=pg_schema
    ).close()
    with MsmMem.open(tmp_path / "s") as again:
        assert again.tenant == "east" and again.verify_audit(AUDITOR).ok


def _upgrade_and_die(directory: Path) -> None:  # pragma: no cover  (runs in the child)
    import msm_mem._governance.audit.log as audit

    def killed(*_: object) -> None:  # SIGKILL just before the upgrade's transaction commits
        os.kill(os.getpid(), signal.SIGKILL)

    audit.write_head = killed  # type: ignore[assignment]
    MsmMem.upgrade(directory, ADMIN)


def test_a_kill_inside_the_upgrade_leaves_the_schema_2_store(tmp_path: Path, new_mem: MemFactory) -> None:
    """The upgrading process killed (SIGKILL) after the tables were altered, before the commit:
    the store is the schema-2 one (no tenant column), and a second upgrade succeeds."""
    directory, held = _v2_store(tmp_path, new_mem)
    child = multiprocessing.get_context("fork").Process(target=_upgrade_and_die, args=(directory,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    _still_v2(directory)
    MsmMem.upgrade(directory, ADMIN)
    with MsmMem.open(directory) as mem:
        assert _held(mem) == held
        assert mem.verify_audit(AUDITOR).ok
