"""The governed Python API and CLI with the store of record on PostgreSQL (a real server that
the tests start): init, the online loop, reopening, audit verification and tamper detection,
crypto-shredding, and init undoing itself when it fails."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from msm_mem import AccessDenied, ConsentRecord, InvalidInput, StoreError
from msm_mem._api.mem import MsmMem
from msm_mem._storage.location import LOCATION_FILE
from msm_mem._storage.postgres import PostgresStore
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.helpers import ADMIN, AGENT, key_folder, png
from tests.layers import layers_of

pytestmark = pytest.mark.postgres

ANSWER = "Right lower lobe consolidation, new since prior"


@pytest.fixture
def schema(pg_schema: str) -> str:
    return pg_schema


def _tables(url: str, schema: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()
    return {r[0] for r in rows}


def test_init_keeps_keys_local_and_no_password_on_disk(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """init on a server: store.json names schema and DSN without the password; keys stay local."""
    with_password = make_conninfo(postgres_url, password="not-stored-anywhere")  # the server trusts the socket
    with MsmMem.init(tmp_path / "m", ADMIN, database_url=with_password, schema=schema, clock=FixedClock(1.7e9)) as mem:
        with layers_of(mem) as layers:
            assert isinstance(layers.handle, PostgresStore) and layers.handle.schema == schema
            tenant = layers.handle.store_id
    spec = json.loads((tmp_path / "m" / LOCATION_FILE).read_text())
    assert spec["backend"] == "postgresql" and spec["schema"] == schema
    assert "not-stored-anywhere" not in (tmp_path / "m" / LOCATION_FILE).read_text()
    assert not (tmp_path / "m" / "keys" / "kek.json").exists()
    assert (key_folder(tmp_path / "m") / "kek.json").stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "m" / "msm-mem.sqlite").exists()
    assert {"meta", "episodic", "audit", "keys", "consents"} <= _tables(postgres_url, schema)
    with MsmMem.open(tmp_path / "m", clock=FixedClock(1.7e9)) as mem:
        with layers_of(mem) as layers:
            assert layers.handle.store_id == tenant  # the AAD binding survives reopening


def test_online_loop_reopen_and_verify(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """Asks write back to the server store; a reopened handle retrieves them, decrypted, and
    the audit chain (rows on the server, checkpoints in the directory) verifies."""
    directory = tmp_path / "m"
    fixed = FixedBackbone(ANSWER, "treat")
    with MsmMem.init(
        directory, ADMIN, database_url=postgres_url, schema=schema, clock=FixedClock(1.7e9), backbone=fixed
    ) as mem:
        first = mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?", study_id="S1")
        assert first.gate is not None and first.gate.written
        mem.checkpoint(ADMIN)
    with MsmMem.open(directory, clock=FixedClock(1.7e9 + 60), backbone=fixed) as mem:
        second = mem.ask(AGENT, "P1", png(tmp_path, 2), "Any change?", study_id="S2")
        kinds = {e.kind for e in second.evidence}
        assert {"semantic", "episodic", "visual"} <= kinds
        episodes = mem.episodes(AGENT, "P1")
        assert [e.study_id for e in episodes] == ["S1", "S2"]
        assert all(e.answer == ANSWER and e.patient_id == "P1" for e in episodes)
        assert episodes[0].episode_id in {e.id for e in second.evidence}
        assert mem.verify_audit(ADMIN).ok and mem.verify_audit(ADMIN, full=False).ok
    with psycopg.connect(postgres_url) as conn:  # the server holds ciphertext, not the answer
        stored = conn.execute(sql.SQL("SELECT answer FROM {}.episodic").format(sql.Identifier(schema))).fetchall()
    assert stored and all(row[0].startswith("enc1:") and ANSWER not in row[0] for row in stored)


def test_cli_on_postgres_and_tamper_detection(
    tmp_path: Path, postgres_url: str, schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """init --database-url, ask --json and audit verify work through the CLI (ask as the
    identity init recorded, verify as an auditor); editing one audit row on the server makes
    verify exit 3 naming that event."""
    directory = str(tmp_path / "m")
    assert main(["init", directory, "--database-url", postgres_url, "--schema", schema, "--actor", "dba"]) == 0
    assert f"PostgreSQL schema {schema}" in capsys.readouterr().out
    image = str(png(tmp_path, 3))
    assert main(["ask", directory, "--patient", "P9", "--image", image, "--question", "Impression?", "--json"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert set(reply) >= {"answer", "evidence", "gate"}
    assert main(["audit", "verify", directory, *AUDITOR_FLAGS]) == 0
    assert "intact" in capsys.readouterr().out
    with psycopg.connect(postgres_url) as conn:
        audit = sql.Identifier(schema, "audit")
        third = sql.SQL("SELECT seq, payload FROM {} ORDER BY seq LIMIT 1 OFFSET 2").format(audit)
        seq, payload = conn.execute(third).fetchone() or (0, b"")
        forged = bytes(payload).replace(b'"success"', b'"failure"', 1)
        assert forged != bytes(payload)
        conn.execute(sql.SQL("UPDATE {} SET payload = %s WHERE seq = %s").format(audit), (forged, seq))
    assert main(["audit", "verify", directory, *AUDITOR_FLAGS]) == 3
    assert f"seq {seq}" in capsys.readouterr().out


def test_shred_on_postgres_keeps_the_chain(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """Crypto-shredding a patient on the server store retracts their records; the chain verifies."""
    with MsmMem.init(
        tmp_path / "m",
        ADMIN,
        database_url=postgres_url,
        schema=schema,
        clock=FixedClock(1.7e9),
        backbone=FixedBackbone(ANSWER, "treat"),
    ) as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?", study_id="S1")
        mem.ask(AGENT, "P2", png(tmp_path, 2), "What is the impression?", study_id="S1")
        mem.shred(ADMIN, "P1", reason="erasure request")
        with layers_of(mem) as layers:
            assert layers.store.record_ids("episodic", "P1") == []
            assert len(layers.store.record_ids("episodic", "P2")) == 1
        assert mem.verify_audit(ADMIN).ok


def test_failed_init_removes_the_server_store(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """When init fails after making the server store (here: a bad consent record), its tables,
    its schema and the directory are removed again."""
    bad = ConsentRecord("C-1", "P1", "role:agent", "treatment", "permit", ("no-such-class",), 0.0)
    with pytest.raises(InvalidInput):
        MsmMem.init(
            tmp_path / "m", ADMIN, database_url=postgres_url, schema=schema, policy=[bad], clock=FixedClock(1.7e9)
        )
    assert _tables(postgres_url, schema) == set()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None
    assert not (tmp_path / "m").exists()


def test_second_init_on_a_used_schema_is_refused(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """Another directory cannot init over a schema holding a store; the first store is intact."""
    with MsmMem.init(
        tmp_path / "a",
        ADMIN,
        database_url=postgres_url,
        schema=schema,
        clock=FixedClock(1.7e9),
        backbone=FixedBackbone(ANSWER, "treat"),
    ) as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?", study_id="S1")
        with layers_of(mem) as layers:
            head = layers.store.audit_head()
    with pytest.raises(StoreError, match="already holds a store"):
        MsmMem.init(tmp_path / "b", ADMIN, database_url=postgres_url, schema=schema, clock=FixedClock(1.7e9))
    assert not (tmp_path / "b").exists()
    with MsmMem.open(tmp_path / "a", clock=FixedClock(time.time())) as mem:
        with layers_of(mem) as layers:
            assert layers.store.audit_head() == head
        assert mem.verify_audit(ADMIN).ok


def test_shred_by_another_handle_stops_the_next_turn(tmp_path: Path, postgres_url: str, schema: str) -> None:
    """A server process keeps its handle open while the CLI shreds a patient through another:
    the running handle's next turn for that patient is refused and writes nothing of them."""
    with MsmMem.init(
        tmp_path / "m",
        ADMIN,
        database_url=postgres_url,
        schema=schema,
        clock=FixedClock(1.7e9),
        backbone=FixedBackbone(ANSWER, "treat"),
    ) as running:
        running.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?", study_id="S1")
        with MsmMem.open(tmp_path / "m", clock=FixedClock(1.7e9)) as cli:
            cli.shred(ADMIN, "P1", reason="erasure request")
        with pytest.raises(AccessDenied, match="shredded"):
            running.ask(AGENT, "P1", png(tmp_path, 2), "Any change?", study_id="S2")
        with layers_of(running) as layers:
            assert layers.store.record_ids("episodic", "P1") == []
            assert layers.store.stm_list(patient_id="P1") == []  # the first turn's item erased, nothing new
        assert running.verify_audit(ADMIN).ok
