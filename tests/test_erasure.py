"""Erasure that leaves nothing (issue 39, item 4): after ``shred`` no file of the store directory
(database, WAL, shared memory, vector and graph caches, an export made after it) and no table
of the PostgreSQL store holds the patient's id, study id, text or vector bytes; copies derived
from the patient's records are retracted; the signed receipt verifies against the chain, and a
changed one does not; a failing erasure writes nothing."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from msm_mem import AccessDenied, ConsentRecord, ErasureReceipt, IllegalTransition, MsmMem, Settings, StoreError
from msm_mem._agent.agent import Query
from msm_mem._records import ManifestRow, State, new_id
from msm_mem._storage.batch import Erasure, WriteBatch
from msm_mem._storage.location import read_location
from msm_mem.testing import FixedClock
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, EXPORTER, INGEST, audit_events, png, raw_sql
from tests.layers import layers_of, open_layers

T0 = 1_700_000_000.0
PB = "PBQ7X2ZK"  # the patient erased: an id no other byte of the store spells
STUDY = "STUDY-W9K4TJ"
TEXT = "Quokkaform opacity at the lingula"  # a distinctive answer of theirs
KEEP = "PKEEPER5"
WHEN = T0 - 3 * 86400 + 0.25  # the exact time of PB's study, no other row's


def _deny_population(patient: str) -> ConsentRecord:
    return ConsentRecord(new_id("C"), patient, "role:agent", "*", "deny", ("population",), 0.0, None, T0)


def _rows(folder: Path) -> list[ManifestRow]:
    return [
        ManifestRow(PB, STUDY, WHEN, str(png(folder, 1)), "Any consolidation?", TEXT, decision="admit"),
        ManifestRow(KEEP, "STUDY-KEEP", T0 - 86400, str(png(folder, 2)), "Any change?", "Stable lungs."),
    ]


@pytest.fixture
def mem(new_mem: Any, tmp_path: Path) -> Iterator[MsmMem]:
    """A store holding PB (ingested, asked once, a consent of their own), KEEP (who denies
    population use) and PNEW, whose answer was derived from PB's record."""
    m: MsmMem = new_mem("s", clock=FixedClock(T0), settings=Settings(population_search="hnsw"))
    m.grant(ADMIN, [_deny_population(KEEP)])
    m.ingest(INGEST, _rows(tmp_path))
    m.ask(AGENT, PB, png(tmp_path, 3), "Any consolidation?", study_id="STUDY-W9K4TK")
    m.grant(ADMIN, [ConsentRecord(new_id("C"), PB, "role:clinician", "research", "deny", ("*",), 0.0, None, T0)])
    derived = m.ask(AGENT, "PNEW", png(tmp_path, 4), "Any consolidation?", study_id="N0")
    assert derived.evidence and m.episodes(AGENT, "PNEW")[0].source.startswith("population:")
    yield m


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Handles a test opens, closed at its end."""
    with ExitStack() as opened:
        yield opened


def _vector(mem: MsmMem) -> bytes:
    with layers_of(mem) as layers:
        ids = layers.store.record_ids("episodic", PB)
        return bytes(layers.store.get_episodes(ids[:1])[0].z.tobytes())


def _needles(vector: bytes) -> dict[str, bytes]:
    """What must not be found: the id, the study id, the text, and slices of the vector (the
    first 16 dimensions, the thumbnail's first row; and two more further in)."""
    chunks = {f"vector[{i}:{i + 16}]": vector[4 * i : 4 * (i + 16)] for i in (0, 64, 128)}
    when = {"study time": struct.pack(">d", WHEN)}  # as SQLite stores a REAL
    return {"patient id": PB.encode(), "study id": STUDY.encode(), "text": TEXT.encode(), **when, **chunks}


def _found(folder: Path, needles: dict[str, bytes]) -> dict[str, list[str]]:
    """Which needles each file under ``folder`` holds (every file, read whole)."""
    hits: dict[str, list[str]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for name, needle in needles.items():
            if needle in data:
                hits.setdefault(name, []).append(str(path.relative_to(folder)))
    return hits


def _graph_cosine(folder: Path, record_id: str, vector: bytes) -> float:
    """The cosine of the saved HNSW graph's (8-bit) copy of a record's vector with the vector."""
    import faiss
    import numpy as np

    (pos,) = raw_sql(folder, "SELECT pos FROM episodic WHERE id = ?", (record_id,))[0]
    coded = faiss.read_index(str(folder / "index" / "episodic.graph")).reconstruct(int(pos))
    z = np.frombuffer(vector, dtype=np.float32)
    return float(coded @ z / (np.linalg.norm(coded) * np.linalg.norm(z) or 1.0))


def _embedded_store_is_clean(mem: MsmMem, tmp_path: Path) -> None:
    """Before the shred the database (or WAL), the vector cache and an export hold PB's id,
    study id and vector bytes (the export the text too); after it, no file under the store
    directory, an export made after it included, holds any of them: open, and closed."""
    folder = tmp_path / "s"
    vector = _vector(mem)
    needles = _needles(vector)
    with layers_of(mem) as layers:  # another handle, closed before the shred
        first = layers.store.record_ids("episodic", PB)[0]
        layers.store.flush()  # type: ignore[attr-defined]  # the vector caches written as they are now
    assert _graph_cosine(folder, first, vector) > 0.95  # the graph's codes are a copy of the vector
    before = _found(folder, needles)
    assert {"patient id", "study id", "study time", "vector[0:16]", "vector[64:80]"} <= set(before)
    assert any(f.startswith("index/episodic") for f in before["vector[0:16]"])
    mem.export_paper(EXPORTER, tmp_path / "export-before")
    assert set(_found(tmp_path / "export-before", needles)) == set(needles) - {"study time"}  # (there as text)
    receipt = mem.shred(ADMIN, PB, "erasure request")
    assert receipt.count("episodic") == 2 and receipt.count("visual") == 2
    assert receipt.count("consents") == 1 and receipt.count("keys") == 1 and receipt.derived >= 1
    mem.export_paper(EXPORTER, folder / "export-after")
    mem.export_fhir(AUDITOR, folder / "export-after" / "audit.ndjson")
    assert _found(folder, needles) == {}
    assert abs(_graph_cosine(folder, first, vector)) < 0.2  # the graph was rebuilt over the zero vector
    mem.close()
    assert _found(folder, needles) == {}
    with MsmMem.open(folder, clock=FixedClock(T0)) as again:
        assert again.verify_audit(AUDITOR, receipt=receipt).ok
        again.ask(AGENT, KEEP, png(tmp_path, 2), "Any change?", study_id="STUDY-KEEP")
    assert _found(folder, needles) == {}


def _schema(mem: MsmMem) -> str:
    """The PostgreSQL schema of ``mem``'s store, as its ``store.json`` names it."""
    location = read_location(mem.directory)
    assert location is not None
    return location.schema


def _pg_hits(mem: MsmMem, url: str, vector: bytes) -> dict[str, int]:
    """Rows of every table of the store's schema whose text form holds the id, the study id or
    the text; and rows whose vector is PB's."""
    schema = _schema(mem)
    text = "[" + ",".join(repr(float(x)) for x in __import__("numpy").frombuffer(vector, "float32")) + "]"
    hits: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))]
        for table in tables:
            name = sql.Identifier(schema, table)
            for label, needle in (("patient id", PB), ("study id", STUDY), ("text", TEXT)):
                query = sql.SQL("SELECT count(*) FROM {} t WHERE position(%s IN t::text) > 0").format(name)
                n = int(conn.execute(query, (needle,)).fetchone()[0])  # type: ignore[index]
                if n:
                    hits[f"{table}: {label}"] = n
        for table in ("episodic", "visual"):
            query = sql.SQL("SELECT count(*) FROM {} WHERE z = %s::vector").format(sql.Identifier(schema, table))
            n = int(conn.execute(query, (text,)).fetchone()[0])  # type: ignore[index]
            if n:
                hits[f"{table}: vector"] = n
            query = sql.SQL("SELECT count(*) FROM {} WHERE timestamp = %s").format(sql.Identifier(schema, table))
            n = int(conn.execute(query, (WHEN,)).fetchone()[0])  # type: ignore[index]
            if n:
                hits[f"{table}: study time"] = n
        stats = conn.execute(
            "SELECT count(*) FROM pg_stats WHERE schemaname = %s"
            " AND position(%s IN coalesce(most_common_vals::text, '') || coalesce(histogram_bounds::text, '')) > 0",
            (schema, PB),
        ).fetchone()
        if stats and stats[0]:
            hits["planner statistics: patient id"] = int(stats[0])
    return hits


def _postgres_store_is_clean(mem: MsmMem, url: str, tmp_path: Path) -> None:
    """On PostgreSQL the tables hold PB's id, study id and vector before the shred, and no row
    of any table of the store's schema holds them after it (the audit and key tables
    included); no file of the store directory does either, an export made after it included."""
    vector = _vector(mem)
    with psycopg.connect(url, autocommit=True) as conn:  # as autovacuum would: statistics sampled from the rows
        conn.execute(sql.SQL("ANALYZE {}.episodic").format(sql.Identifier(_schema(mem))))
    before = _pg_hits(mem, url, vector)
    assert {"episodic: patient id", "episodic: study id", "keys: patient id", "episodic: vector"} <= set(before)
    assert {"episodic: study time", "visual: study time"} <= set(before)
    assert "planner statistics: patient id" in before
    receipt = mem.shred(ADMIN, PB, "erasure request")
    assert receipt.count("episodic") == 2 and receipt.count("consents") == 1
    assert _pg_hits(mem, url, vector) == {}
    mem.export_paper(EXPORTER, tmp_path / "s" / "export-after")
    assert _found(tmp_path / "s", _needles(vector)) == {}
    assert mem.verify_audit(AUDITOR, receipt=receipt).ok


def test_after_a_shred_nothing_of_the_patient_is_left(
    mem: MsmMem, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """No file of the store (embedded: database, WAL, caches; both: an export after the shred)
    and no row of the PostgreSQL store holds the patient's id, study id, text or vector."""
    if backend == "postgres":
        _postgres_store_is_clean(mem, request.getfixturevalue("postgres_url"), tmp_path)
    else:
        _embedded_store_is_clean(mem, tmp_path)


def test_the_receipt_is_checked_against_the_chain(mem: MsmMem, stack: ExitStack) -> None:
    """The receipt names the last event of the shred (the patient's, under their pseudonym, one
    record id per row destroyed); it verifies, survives JSON, and a receipt with another count,
    seq or signature does not."""
    receipt = mem.shred(ADMIN, PB, "erasure request")
    layers = stack.enter_context(layers_of(mem))
    events = audit_events(layers.store)
    event = events[-1]
    assert (event.seq, event.event_hash, event.patient) == (receipt.seq, receipt.event_hash, receipt.pseudonym)
    assert (event.action, event.purpose, event.reason) == ("retract", "erasure", "erasure request")
    assert len(event.record_ids) == receipt.records > 0
    assert [e for e in events if e.patient == receipt.pseudonym and e.purpose == "erasure"] == [event]
    assert mem.verify_audit(ADMIN, receipt=receipt).ok
    assert mem.verify_audit(ADMIN, receipt=ErasureReceipt.from_json(receipt.to_json())).ok
    counts = tuple((t, n + 1 if t == "episodic" else n) for t, n in receipt.counts)
    for bad in (
        replace(receipt, counts=counts),
        replace(receipt, seq=receipt.seq - 1),
        replace(receipt, signature="00" * 64),
        layers.audit.sign_receipt(replace(receipt, seq=receipt.seq - 1)),
        layers.audit.sign_receipt(replace(receipt, counts=counts)),
    ):
        result = mem.verify_audit(ADMIN, receipt=bad)
        assert not result.ok and result.first_bad_seq == bad.seq


def test_derived_copies_are_retracted_and_the_patient_is_gone(mem: MsmMem, tmp_path: Path) -> None:
    """PNEW's answer derived from PB's record is retracted and blanked; PB has no row left,
    no pseudonym, and can be written no more; KEEP is untouched."""
    keep = mem.episodes(AGENT, KEEP)
    mem.shred(ADMIN, PB, "erasure request")
    assert mem.episodes(AGENT, "PNEW") == []
    with layers_of(mem) as layers:
        blanked = [e for e in layers.store.iter_episodes() if e.patient_id == "PNEW"]
        assert blanked and all(e.state == State.RETRACTED and e.answer == "" for e in blanked)
        assert all(ids == [] for ids in layers.store.patient_rows(PB).values())
        assert layers.store.keys().get(PB) is None and layers.cipher.is_shredded(PB)
    with pytest.raises(AccessDenied, match="shredded"):
        mem.ask(AGENT, PB, png(tmp_path, 5), "Any change?")
    assert mem.episodes(AGENT, KEEP) == keep
    assert mem.verify_audit(AUDITOR).ok


def test_an_erasure_that_fails_writes_nothing(mem: MsmMem) -> None:
    """An erasure naming a row of another patient, or leaving one of the patient's rows, is
    refused whole: every row of the patient is still there, readable."""
    with layers_of(mem) as layers:
        rows = layers.store.patient_rows(PB)
        other = layers.store.record_ids("episodic", KEEP)
        head = layers.store.audit_head()
        wrong = Erasure(PB, None, (("episodic", tuple(rows["episodic"] + other)),))
        with pytest.raises(IllegalTransition):
            layers.store.write(WriteBatch(erase=[wrong]))
        partial = Erasure(PB, None, (("episodic", tuple(rows["episodic"])),))
        with pytest.raises(StoreError, match="nothing was erased"):
            layers.store.write(WriteBatch(erase=[partial]))
        assert layers.store.patient_rows(PB) == rows and layers.store.audit_head() == head
    assert {e.answer for e in mem.episodes(AGENT, PB)} >= {TEXT}
    assert mem.verify_audit(AUDITOR).ok


def _vector_needles(mem: MsmMem, patient: str) -> dict[str, bytes]:
    with layers_of(mem) as layers:
        ids = layers.store.record_ids("episodic", patient)
        vector = bytes(layers.store.get_episodes(ids[:1])[0].z.tobytes())
    return {f"{patient} vector[{i}:{i + 16}]": vector[4 * i : 4 * (i + 16)] for i in (0, 64, 128)}


def test_another_handle_keeps_no_erased_vector(new_mem: Any, backend: str, tmp_path: Path) -> None:
    """A second handle on the store (a server while the CLI shreds) follows an erasure made by
    another: its next turn rebuilds its caches from the rows, and a handle closed without a turn
    since does not save caches that still hold the erased vectors."""
    folder = tmp_path / "s"
    first: MsmMem = new_mem("s", clock=FixedClock(T0))
    first.ingest(INGEST, _rows(tmp_path))
    pb, keep = _vector_needles(first, PB), _vector_needles(first, KEEP)
    with open_layers(folder, clock=FixedClock(T0)) as server:  # the server's store handle and agent
        server.agent.ask(AGENT, Query(KEEP, png(tmp_path, 6), "Any change?", study_id="STUDY-KEEP"))  # caches filled
        if backend == "sqlite":
            server.handle.flush()  # type: ignore[attr-defined]  # this handle's caches, on disk now
            assert set(_found(folder, {**pb, **keep})) == {*pb, *keep}
        first.shred(ADMIN, PB, "erasure request")
        server.agent.ask(AGENT, Query(KEEP, png(tmp_path, 7), "Any change?", study_id="STUDY-KEEP"))
    first.close()
    assert _found(folder, pb) == {}
    if backend == "sqlite":
        assert set(_found(folder, keep)) == set(keep)  # the other patient's vectors are still cached
    with MsmMem.open(folder, clock=FixedClock(T0)) as stale:
        stale.ask(AGENT, KEEP, png(tmp_path, 8), "Any change?", study_id="STUDY-KEEP")
        with MsmMem.open(folder, clock=FixedClock(T0)) as other:
            other.shred(ADMIN, KEEP, "erasure request")
    assert _found(folder, keep) == {}


def test_the_cli_writes_the_receipt_and_audit_verify_checks_it(
    new_mem: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`keys shred --receipt FILE` writes the signed receipt; `audit verify --receipt FILE` exits 0
    with it and 3 with a receipt whose counts were changed."""
    from msm_mem.interfaces.cli import main
    from tests.cli_support import ADMIN as ADMIN_FLAGS
    from tests.cli_support import admin_credential

    mem: MsmMem = new_mem("s", clock=FixedClock(T0))
    admin_credential(mem.directory)
    mem.ingest(INGEST, _rows(tmp_path))
    mem.close()
    receipt_file = tmp_path / "receipt.json"
    store = str(tmp_path / "s")
    args = ["keys", "shred", store, "--patient", PB, "--reason", "erasure request", "--receipt", str(receipt_file)]
    assert main([*args, *ADMIN_FLAGS]) == 0
    assert "records retracted and erased (episodic 1, visual 1" in capsys.readouterr().out
    receipt = ErasureReceipt.from_json(receipt_file.read_text())
    assert receipt.count("episodic") == 1 and receipt.count("keys") == 1
    assert main(["audit", "verify", store, "--receipt", str(receipt_file), *ADMIN_FLAGS]) == 0
    forged = replace(receipt, counts=tuple((t, n + 1) for t, n in receipt.counts))
    (tmp_path / "forged.json").write_text(forged.to_json())
    assert main(["audit", "verify", store, "--receipt", str(tmp_path / "forged.json"), *ADMIN_FLAGS]) == 3


def test_the_service_returns_the_receipt_and_verifies_it(tmp_path: Path) -> None:
    """POST /v1/patients/{id}/shred answers the rows destroyed and the signed receipt; POST
    /v1/audit/verify-erasure says ok for it and not ok for one with another count."""
    from fastapi.testclient import TestClient

    from msm_mem import Principal
    from msm_mem.interfaces.auth.apikeys import ApiKeyStore
    from msm_mem.interfaces.http.app import create_app
    from msm_mem.interfaces.http.config import ServeConfig

    with MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(T0)) as mem:
        mem.ingest(INGEST, _rows(tmp_path))
    keys = ApiKeyStore.of_store(tmp_path / "s")
    admin, _ = keys.create(Principal("svc-admin", "admin", "erasure"), [PB])
    auditor, _ = keys.create(Principal("svc-auditor", "auditor", "audit"), [PB])
    with TestClient(create_app(ServeConfig(tmp_path / "s"))) as client:
        reply = client.post(
            f"/v1/patients/{PB}/shred", json={"reason": "erasure request"}, headers={"Authorization": f"Bearer {admin}"}
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["count"] == sum(n for t, n in body["receipt"]["counts"].items() if t != "keys") > 0
        receipt = body["receipt"]
        check = {"Authorization": f"Bearer {auditor}"}
        assert client.post("/v1/audit/verify-erasure", json=receipt, headers=check).json()["ok"] is True
        forged = {**receipt, "counts": {**receipt["counts"], "episodic": receipt["counts"]["episodic"] + 1}}
        result = client.post("/v1/audit/verify-erasure", json=forged, headers=check).json()
        assert result["ok"] is False and result["first_bad_seq"] == receipt["seq"]


def test_a_patient_shredded_before_erasure_is_erased_by_a_second_shred(new_mem: Any, tmp_path: Path) -> None:
    """A patient whose data key alone was destroyed (rows left, the key row naming them) by
    another handle is erased by shredding them again through a handle that was open all along
    (a server, its key cache filled before): no row names them any more and the receipt
    verifies."""
    mem: MsmMem = new_mem("s", clock=FixedClock(T0))
    mem.ingest(INGEST, _rows(tmp_path))
    assert mem.episodes(CLINICIAN, PB)  # this handle has the patient's key cached
    with open_layers(tmp_path / "s") as layers:
        # as msm-mem shredded before erasure: its event naming the patient, then only the key
        # destroyed (its row keeps the id), the rows left
        old = layers.audit.spec(
            actor="admin-1",
            role="admin",
            action="retract",
            source_tier="ltm",
            target_tier="ltm",
            purpose="erasure",
            patient=PB,
            reason="erasure request",
        )
        layers.audit.write(WriteBatch(), [old])
        layers.store.keys().shred(PB)
        assert layers.cipher.is_shredded(PB) and layers.store.patient_rows(PB)["episodic"]
    receipt = mem.shred(ADMIN, PB, "erasure request")
    assert receipt.pseudonym == "" and receipt.count("episodic") == 1 and receipt.count("keys") == 0
    with layers_of(mem) as layers:
        assert all(ids == [] for ids in layers.store.patient_rows(PB).values())
        assert layers.store.keys().get(PB) is None and layers.cipher.is_shredded(PB)
    assert mem.verify_audit(AUDITOR, receipt=receipt).ok


def test_an_erasure_keeps_the_vector_order_and_searches_never_find_it(
    store: Any, reopen: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """At the store: the erased episodes keep their positions (counts and the next positions
    unchanged), no patient-scoped or population search returns them, later writes continue the
    order, and another handle opened afterwards searches the same (its caches vouched for by
    the recomputed vector digest)."""
    import numpy as np

    from msm_mem._records import EpisodicRecord
    from tests.conftest import random_unit

    rng = np.random.default_rng(3)
    records = [
        EpisodicRecord(f"E-{i}", "pb" if i % 2 else "pk", 1e9 + i, random_unit(rng), "q?", f"answer {i}")
        for i in range(6)
    ]
    store.write(WriteBatch(episodes=records))
    erased = tuple(r.episode_id for r in records if r.patient_id == "pb")
    store.write(WriteBatch(erase=[Erasure("pb", None, (("episodic", erased),))]))
    assert store.count("episodic") == 6 and store.patient_rows("pb")["episodic"] == []
    for r in records:
        assert store.search("episodic", r.z, 6, "pb") == []
        assert not {i for i, _ in store.search("episodic", r.z, 6, None)} & set(erased)
    later = EpisodicRecord("E-6", "pk", 1e9 + 6, random_unit(rng), "q?", "answer 6")
    store.write(WriteBatch(episodes=[later]))
    other = reopen(store)
    assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]  # the saved caches were vouched for
    for handle in (store, other):
        hits = handle.search("episodic", later.z, 10, None)
        assert hits[0][0] == "E-6" and not {i for i, _ in hits} & set(erased)
        assert [e.episode_id for e in handle.iter_episodes()] == [f"E-{i}" for i in range(7)]
