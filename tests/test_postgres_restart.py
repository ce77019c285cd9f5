"""The PostgreSQL server really stopped (``pg_ctl stop -m immediate``, a crash of the server)
and started again while a client writes and reads through ``MsmMem``: the call in flight fails
with a clear :class:`StoreError` and is never reported done unless it was committed, calls
while the server is down fail the same way, the first call after it is back reconnects and
works, nothing acknowledged is lost and the chain and the rows verify.

The test starts a server of its own (pgserver's binaries, its own data directory), since it
stops it; the session's shared server is left alone."""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from msm_mem import MsmMem, StoreError
from msm_mem._storage.sql_write import SqlWriter
from msm_mem._tier_records import ConsentRecord
from tests.conftest import SKIP_POSTGRES
from tests.helpers import ADMIN, AGENT, AUDITOR, png

pytestmark = [
    pytest.mark.system,
    pytest.mark.postgres,
    pytest.mark.skipif(SKIP_POSTGRES, reason="MSM_MEM_SKIP_POSTGRES is set"),
]

#: restarts at random moments of the writing loop (each takes about a second)
RANDOM_RESTARTS = 6


class Server:
    """A pgserver PostgreSQL of this test: stop it as a crash would, start it again."""

    def __init__(self, datadir: Path) -> None:
        pgserver = pytest.importorskip("pgserver")
        from pgserver._commands import pg_ctl

        self._server = pgserver.get_server(datadir, cleanup_mode="delete")
        self._pg_ctl = pg_ctl
        self.dsn = str(self._server.get_uri())

    def stop(self) -> None:
        self._pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=self._server.pgdata, user=self._server.system_user)

    def start(self) -> None:
        self._server.ensure_postgres_running()

    def close(self) -> None:
        self._server.cleanup()


@pytest.fixture
def server() -> Iterator[Server]:
    # not under tmp_path: pytest resets the mode of its temporary root to 0700 when another
    # session starts, which takes the server's own user out of its data directory
    parent = Path(tempfile.mkdtemp(prefix="msm-mem-pg-restart-"))
    s = Server(parent / "data")
    try:
        yield s
    finally:
        s.start()
        s.close()
        shutil.rmtree(parent, ignore_errors=True)


def _consent(name: str) -> ConsentRecord:
    return ConsentRecord(f"C-{name}", f"P-{name}", "role:agent", "treatment", "permit", ("episodic",), 0.0)


def _stored(mem: MsmMem) -> set[str]:
    return {c.consent_id for c in mem.consents(ADMIN)}


def _during_write(hook: Callable[[], None]) -> Callable[[], None]:
    """Run ``hook`` inside the next write transaction, after its rows and before its commit;
    returns the function that removes the hook."""
    original = SqlWriter._append_audit

    def append(self: SqlWriter, audit: Any, head_seq: int | None = None) -> None:
        original(self, audit, head_seq)
        SqlWriter._append_audit = original  # type: ignore[method-assign]
        hook()

    SqlWriter._append_audit = append  # type: ignore[method-assign]
    return lambda: setattr(SqlWriter, "_append_audit", original)


def test_a_restart_inside_a_write_fails_it_and_the_next_call_works(tmp_path: Path, server: Server) -> None:
    """The server stopped inside a write transaction: that call is a StoreError and stores
    nothing; calls while it is down are StoreErrors naming the connection; once it is back the
    next call reconnects and works; everything acknowledged is there and verifies."""
    with MsmMem.init(tmp_path / "s", ADMIN, database_url=server.dsn, schema="restart") as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?", study_id="S1")
        mem.grant(ADMIN, [_consent("before")])
        held = [i.item_id for i in mem.stm_items(AGENT, "P1")]
        undo = _during_write(server.stop)
        try:
            with pytest.raises(StoreError, match="nothing was written"):
                mem.grant(ADMIN, [_consent("in-flight")])
        finally:
            undo()
        with pytest.raises(StoreError, match="PostgreSQL server"):
            mem.grant(ADMIN, [_consent("while-down")])
        with pytest.raises(StoreError, match="PostgreSQL server"):
            mem.stm_items(AGENT, "P1")
        server.start()
        mem.grant(ADMIN, [_consent("after")])
        stored = _stored(mem)
        assert {"C-before", "C-after"} <= stored and not {"C-in-flight", "C-while-down"} & stored
        assert [i.item_id for i in mem.stm_items(AGENT, "P1")] == held and held
        mem.ask(AGENT, "P1", png(tmp_path, 2), "What is the impression?", study_id="S2")
        assert mem.verify_audit(AUDITOR).ok


def test_a_restart_between_calls_is_not_noticed_by_the_next_one(tmp_path: Path, server: Server) -> None:
    """The server stopped and started again while the client is idle: the next write, read and
    ask all work at the first try (the dropped connection is replaced before it is used)."""
    with MsmMem.init(tmp_path / "s", ADMIN, database_url=server.dsn, schema="restart") as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?", study_id="S1")
        for turn in range(3):
            server.stop()
            server.start()
            mem.grant(ADMIN, [_consent(f"between-{turn}")])
            assert f"C-between-{turn}" in _stored(mem)
            mem.ask(AGENT, "P1", png(tmp_path, 2 + turn), "What is the impression?", study_id=f"S{2 + turn}")
        assert mem.verify_audit(AUDITOR).ok


def test_a_restart_at_the_commit_is_never_reported_done_unless_stored(tmp_path: Path, server: Server) -> None:
    """The server stopped just as the commit is sent: the call fails, and it says whether the
    write may have been stored; after the restart it is not, and the store verifies."""
    with MsmMem.init(tmp_path / "s", ADMIN, database_url=server.dsn, schema="restart") as mem:
        original = SqlWriter.write

        def write(self: SqlWriter, batch: Any, chain: Any = None, *, before_commit: Any = None) -> None:
            def stop_then_sign() -> None:
                if before_commit is not None:
                    before_commit()
                server.stop()

            SqlWriter.write = original  # type: ignore[method-assign]
            original(self, batch, chain, before_commit=stop_then_sign)

        SqlWriter.write = write  # type: ignore[method-assign]
        try:
            with pytest.raises(StoreError):
                mem.grant(ADMIN, [_consent("at-commit")])
        finally:
            SqlWriter.write = original  # type: ignore[method-assign]
        server.start()
        assert "C-at-commit" not in _stored(mem)
        assert mem.verify_audit(AUDITOR).ok


def test_random_restarts_while_writing_lose_nothing_acknowledged(tmp_path: Path, server: Server) -> None:
    """A thread stops the server at random moments while the client grants consents in a loop
    and then starts it again: every grant reported done is stored, every grant reported failed
    with 'nothing was written' is not, and the chain and rows verify after each restart."""
    rng = random.Random(13)
    done: list[str] = []
    failed: dict[str, str] = {}
    with MsmMem.init(tmp_path / "s", ADMIN, database_url=server.dsn, schema="restart") as mem:
        for restart in range(RANDOM_RESTARTS):
            stopped = threading.Event()

            def crash(delay: float, stopped: threading.Event) -> None:
                time.sleep(delay)
                server.stop()
                stopped.set()

            killer = threading.Thread(target=crash, args=(rng.uniform(0.0, 0.3), stopped))
            killer.start()
            i = 0
            while not stopped.is_set() or i == 0:
                name = f"r{restart}-{i}"
                try:
                    mem.grant(ADMIN, [_consent(name)])
                    done.append(f"C-{name}")
                except StoreError as exc:
                    failed[f"C-{name}"] = str(exc)
                i += 1
            killer.join()
            server.start()
            stored = _stored(mem)
            assert set(done) <= stored, set(done) - stored
            wrongly = [c for c, why in failed.items() if "nothing was written" in why and c in stored]
            assert not wrongly, wrongly
            result = mem.verify_audit(AUDITOR)
            assert result.ok, result
    assert failed and done  # the loop both wrote and saw the server go


@pytest.mark.parametrize("server_down", [False, True])
def test_a_commit_whose_reply_is_lost_is_never_misreported(tmp_path: Path, server: Server, server_down: bool) -> None:
    """The server commits and the connection is lost before its reply (injected right after a
    real commit: a restart cannot be timed into that gap). With the server reachable the write
    is found by its audit row and reported done; with the server down the call fails saying the
    write may or may not be stored, and once the server is back it is there and verifies."""
    from msm_mem._storage.postgres.connection import PgDialect
    from msm_mem._storage.sql_core import CommitLost

    with MsmMem.init(tmp_path / "s", ADMIN, database_url=server.dsn, schema="restart") as mem:
        original = PgDialect.transaction

        @contextlib.contextmanager
        def lose_the_reply(self: PgDialect) -> Iterator[None]:
            PgDialect.transaction = original  # type: ignore[method-assign]
            with original(self):
                yield
            if server_down:
                server.stop()
            self.conn.close()
            raise CommitLost("server closed the connection unexpectedly (after its commit)")

        PgDialect.transaction = lose_the_reply  # type: ignore[assignment, method-assign]
        try:
            if server_down:
                with pytest.raises(StoreError, match="may or may not be stored"):
                    mem.grant(ADMIN, [_consent("lost-reply")])
                server.start()
            else:
                mem.grant(ADMIN, [_consent("lost-reply")])
        finally:
            PgDialect.transaction = original  # type: ignore[method-assign]
        assert "C-lost-reply" in _stored(mem)
        mem.grant(ADMIN, [_consent("next")])
        assert mem.verify_audit(AUDITOR).ok
