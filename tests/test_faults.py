"""Faults of the medium and the environment: each is a clear error or a recovery, nothing
acknowledged is lost and nothing is reported done that was not committed."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import faiss
import pytest

from msm_mem import InvalidInput, ManifestRow, MsmMem, MsmMemError, StoreError
from msm_mem._tier_records import ConsentRecord
from tests.helpers import ADMIN, AGENT, AUDITOR, INGEST, key_folder, png
from tests.layers import open_layers

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
needs_root = pytest.mark.skipif(not ROOT, reason="mounting a tmpfs or a read-only bind mount needs root")


@contextlib.contextmanager
def _mount(*args: str, target: Path) -> Iterator[Path]:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", *args, str(target)], check=True, capture_output=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)


def _store(directory: Path, images: Path, n: int = 3) -> None:
    """A store with ``n`` ingested studies of two patients (episodes and visuals)."""
    images.mkdir(exist_ok=True)
    answers = ["small left pleural effusion", "no acute cardiopulmonary process", "right lower lobe opacity"]
    rows = [
        ManifestRow(f"P{i % 2}", f"S{i}", 1.6e9 + i, str(png(images, i)), "Findings?", answers[i % 3]) for i in range(n)
    ]
    with MsmMem.init(directory, ADMIN) as mem:
        mem.ingest(INGEST, rows)


def _consent(i: int) -> ConsentRecord:
    return ConsentRecord(f"C-full-{i}", f"P{i}", "role:agent", "treatment", "permit", ("episodic",), 0.0)


# read-only media ---------------------------------------------------------------------------


@needs_root
def test_a_read_only_store_verifies(tmp_path: Path) -> None:
    """A store on a read-only mount opens read-only: verification works, a write is a clear
    StoreError naming read-only, and closing writes nothing."""
    _store(tmp_path / "s", tmp_path / "img")
    ro = tmp_path / "ro"
    with _mount("--bind", str(tmp_path / "s"), target=ro):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True, capture_output=True)
        with pytest.raises(OSError):
            (ro / "probe").write_text("x")
        with MsmMem.open(ro) as mem:
            result = mem.verify_audit(AUDITOR)
            assert result.ok and result.count > 0, result.reason
            with pytest.raises(StoreError, match="read-only"):
                mem.grant(ADMIN, [_consent(1)])


# disk full ---------------------------------------------------------------------------------


def _fill(folder: Path, leave: int) -> Path:
    """Fill the file system of ``folder`` up to ``leave`` free bytes (a filler file)."""
    filler = folder / "filler"
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with filler.open("wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(0, free - leave))
        f.flush()
        os.fsync(f.fileno())
    return filler


@needs_root
def test_a_full_disk_never_reports_a_write_it_did_not_commit(tmp_path: Path) -> None:
    """On a tmpfs filled to a few free bytes, every grant, ask and checkpoint either returns
    and is stored, or raises an MsmMemError/OSError and is not stored; the checkpoint log and
    the chain verify afterwards and the store keeps working once space is back."""
    with _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", target=tmp_path / "fs") as fs:
        _store(fs / "s", tmp_path / "img", n=2)
        outcomes: list[tuple[str, bool]] = []
        for i, leave in enumerate([0, 512, 4096, 16384, 65536, 0, 0]):
            filler = _fill(fs, leave)
            try:
                mem = MsmMem.open(fs / "s")
            except (MsmMemError, OSError):
                filler.unlink()
                continue
            try:
                try:
                    mem.grant(ADMIN, [_consent(i)])
                    outcomes.append((f"C-full-{i}", True))
                except (MsmMemError, OSError):
                    outcomes.append((f"C-full-{i}", False))
                with contextlib.suppress(MsmMemError, OSError):
                    mem.checkpoint(AUDITOR)
            finally:
                with contextlib.suppress(MsmMemError, OSError):
                    mem.close()
            filler.unlink()
        assert outcomes, "no attempt could open the store"
        with MsmMem.open(fs / "s") as mem:
            stored = {c.consent_id for c in mem.consents(ADMIN)}
            for consent_id, acknowledged in outcomes:
                assert (consent_id in stored) == acknowledged, consent_id
            with open_layers(fs / "s") as layers:
                layers.audit.log.all()  # the checkpoint log parses
            result = mem.verify_audit(AUDITOR)
            assert result.ok, result.reason
            mem.grant(ADMIN, [_consent(99)])
            assert "C-full-99" in {c.consent_id for c in mem.consents(ADMIN)}


# the FAISS cache ---------------------------------------------------------------------------


def _search(directory: Path, images: Path) -> list[tuple[str, float]]:
    with open_layers(directory) as layers:
        z = layers.agent.embed(png(images, 0))
        return layers.handle.search("episodic", z, 10, None)


def test_an_overwritten_faiss_cache_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A cache whose vectors but the last were overwritten (sidecar kept) does not match the
    digest the database records: it is rebuilt from the rows, with a warning, and search is as before."""
    _store(tmp_path / "s", tmp_path / "img", n=4)
    before = _search(tmp_path / "s", tmp_path / "img")
    path = tmp_path / "s" / "index" / "episodic.faiss"
    index = faiss.read_index(str(path))
    n, d = index.ntotal, index.d
    vectors = faiss.rev_swig_ptr(index.get_xb(), n * d).reshape(n, d).copy()
    vectors[:-1] = vectors[-1]
    forged = faiss.IndexFlatIP(d)
    forged.add(vectors)
    faiss.write_index(forged, str(path))
    with caplog.at_level("WARNING", logger="msm_mem"):
        assert _search(tmp_path / "s", tmp_path / "img") == before
    assert "does not match the store" in caplog.text


def test_a_stale_or_foreign_faiss_cache_is_caught_up_or_rebuilt(tmp_path: Path) -> None:
    """A cache saved before later writes is caught up; one from another store is rebuilt."""
    _store(tmp_path / "s", tmp_path / "img", n=2)
    old = {p.name: p.read_bytes() for p in (tmp_path / "s" / "index").iterdir()}
    with MsmMem.open(tmp_path / "s") as mem:
        mem.ask(AGENT, "P1", png(tmp_path / "img", 7), "What is the impression?", study_id="S7")
    fresh = _search(tmp_path / "s", tmp_path / "img")
    for name, data in old.items():
        (tmp_path / "s" / "index" / name).write_bytes(data)
    assert _search(tmp_path / "s", tmp_path / "img") == fresh
    _store(tmp_path / "t", tmp_path / "img2", n=3)
    for p in (tmp_path / "t" / "index").iterdir():
        (tmp_path / "s" / "index" / p.name).write_bytes(p.read_bytes())
    assert _search(tmp_path / "s", tmp_path / "img") == fresh


# the key file ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["deleted", "truncated", "not json"])
def test_a_deleted_or_corrupt_key_file_is_a_clear_error(tmp_path: Path, damage: str) -> None:
    """Opening a store whose key file is gone or damaged fails naming the key file, and no
    new key file is made in its place."""
    _store(tmp_path / "s", tmp_path / "img", n=1)
    kek = key_folder(tmp_path / "s") / "kek.json"
    if damage == "deleted":
        kek.unlink()
    elif damage == "truncated":
        kek.write_bytes(kek.read_bytes()[:20])
    else:
        kek.write_bytes(b"\x00\x01 not json")
    with pytest.raises(InvalidInput, match="key file"):
        MsmMem.open(tmp_path / "s")
    assert kek.exists() == (damage != "deleted")


def test_rotation_retires_old_keks_and_leaves_no_key_material(tmp_path: Path) -> None:
    """After every committed rotation the key file holds only the current KEK; temporary files
    of an interrupted rewrite (a kill before its rename) are removed on open."""
    _store(tmp_path / "s", tmp_path / "img", n=2)
    keys = key_folder(tmp_path / "s")
    (keys / ".kek.json.0123456789abcdef.tmp").write_bytes(b'{"keys": "material"}')
    with MsmMem.open(tmp_path / "s") as mem:
        assert not list(keys.glob("*.tmp"))
        answers = [e.answer for e in mem.episodes(AGENT, "P0")]
        for _ in range(5):
            mem.rotate_keys(ADMIN, "scheduled rotation")
            with open_layers(tmp_path / "s") as layers:
                assert len(layers.keys.kek_ids()) == 1  # type: ignore[attr-defined]
    with MsmMem.open(tmp_path / "s") as mem:
        assert [e.answer for e in mem.episodes(AGENT, "P0")] == answers


# PostgreSQL --------------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_connection_lost_mid_request_is_a_clear_error_then_works(tmp_path: Path, postgres_url: str) -> None:
    """The server dropping the store's connection (a restart) in the middle of a write fails
    that call with StoreError and nothing written; the next call reconnects and works."""
    import psycopg

    from msm_mem._storage.sql_write import SqlWriter

    with MsmMem.init(tmp_path / "s", ADMIN, database_url=postgres_url, schema=f"t_faults_{os.getpid()}") as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?", study_id="S1")
        episodes = len(mem.episodes(AGENT, "P1"))
        # the connection of this very handle is the one to drop: no public way names it
        pid = mem._store._sql.conn.info.backend_pid  # type: ignore[attr-defined]
        original = SqlWriter._append_audit

        def drop_then_append(self: SqlWriter, audit: object, head_seq: int | None = None) -> None:
            with psycopg.connect(postgres_url, autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", (pid,))
            original(self, audit, head_seq)  # type: ignore[arg-type]

        SqlWriter._append_audit = drop_then_append  # type: ignore[method-assign]
        try:
            with pytest.raises(StoreError, match="nothing was written"):
                mem.grant(ADMIN, [_consent(5)])
        finally:
            SqlWriter._append_audit = original  # type: ignore[method-assign]
        mem.grant(ADMIN, [_consent(6)])
        stored = {c.consent_id for c in mem.consents(ADMIN)}
        assert "C-full-6" in stored and "C-full-5" not in stored
        assert mem.verify_audit(AUDITOR).ok
        assert len(mem.episodes(AGENT, "P1")) == episodes
