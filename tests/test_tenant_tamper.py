"""A row moved from one tenant to another by SQL straight on the shared database (a hostile
operator who has the tables but not the keys) is caught by both tenants' full audit
verification: each tenant's row digests cover exactly its own rows. On a real PostgreSQL
started by the tests (synthetic data only)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from msm_mem import ManifestRow, MsmMem
from msm_mem._settings import Settings
from msm_mem.testing import FixedBackbone, FixedClock
from tests.helpers import ADMIN, AUDITOR, SYSTEM, png

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"


def _tenant(tmp_path: Path, url: str, schema: str, tenant: str, seed: int) -> Path:
    options = {"database_url": url, "schema": schema, "clock": FixedClock(T0)}
    with MsmMem.init(tmp_path / tenant, ADMIN, settings=Settings(tenant=tenant), **options) as mem:
        rows = [
            ManifestRow("P-1", f"S{seed}-{i}", T0 - 86400 * i, str(png(tmp_path, seed + i)), QUESTION, "effusion")
            for i in range(2)
        ]
        mem.ingest(SYSTEM, rows)
    return tmp_path / tenant


@pytest.mark.postgres
@pytest.mark.parametrize("table", ["episodic", "semantic", "claims"])
def test_a_row_moved_to_another_tenant_fails_both_verifications(
    tmp_path: Path, postgres_url: str, pg_schema: str, table: str
) -> None:
    east, west = (_tenant(tmp_path, postgres_url, pg_schema, t, s) for t, s in (("east", 0), ("west", 10)))
    for directory in (east, west):
        with MsmMem.open(directory, clock=FixedClock(T0 + 60), backbone=FixedBackbone("a", "b")) as mem:
            assert mem.verify_audit(AUDITOR).ok
    shift = ", pos = pos + 1000" if table == "episodic" else ""  # west has positions of its own
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        moved = conn.execute(
            f'UPDATE "{pg_schema}".{table} SET tenant = %s{shift} WHERE ctid = (SELECT ctid FROM "{pg_schema}".{table}'
            " WHERE tenant = %s LIMIT 1)",
            ("west", "east"),
        ).rowcount
    assert moved == 1
    for directory in (east, west):
        with MsmMem.open(directory, clock=FixedClock(T0 + 120), backbone=FixedBackbone("a", "b")) as mem:
            result = mem.verify_audit(AUDITOR)
            assert not result.ok
            assert table in str(result)
