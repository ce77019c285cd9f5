"""A local PostgreSQL server (with pgvector) for tests and single-machine use, from ``pgserver``.

The ``pgserver`` package ships PostgreSQL 16 binaries with the pgvector extension. The server
it starts listens on a Unix domain socket only (it is started with no TCP address at all), so
nothing outside the machine can reach it; the DSN returned points at that socket::

    from msm_mem._storage.pgserver_util import local_server
    from msm_mem._storage.postgres import PostgresStore

    dsn = local_server("pgdata")          # initialises the directory on first use
    store = PostgresStore.create(dsn, dim=1024, encoder="pixels")

Starting takes about a second on a fresh directory and less on an initialised one.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from .._errors import MissingExtra, StoreError

__all__ = ["local_server"]


def _import_pgserver() -> Any:
    # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (containers, CI); that
    # warning says nothing about our use, and tests run with warnings as errors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import pgserver
        except ImportError as exc:
            raise MissingExtra("pgserver", "postgres") from exc
    return pgserver


def local_server(datadir: str | Path, *, delete_at_exit: bool = False) -> str:
    """Start (or reuse) a PostgreSQL server whose data lives in ``datadir``; return its DSN.

    The directory is created and initialised when it does not hold a cluster yet; its parent
    must exist or be creatable. The server listens on a Unix socket only (no TCP port) and is
    stopped when the last Python process using it exits; with ``delete_at_exit`` the data
    directory is removed too (throwaway servers for tests). Calling it twice with the same
    directory in one process returns the same server.

    Raises :class:`MissingExtra` when ``pgserver`` is not installed and :class:`StoreError`
    when the server does not start (the message includes the server's reason).
    """
    pgserver = _import_pgserver()
    path = Path(datadir).expanduser().resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = pgserver.get_server(path, cleanup_mode="delete" if delete_at_exit else "stop")
    except Exception as exc:  # OSError, or pgserver's bare subprocess / assertion errors
        log = path / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
        raise StoreError(f"could not start PostgreSQL in {path}: {exc!r}\n{tail}".rstrip()) from exc
    return str(server.get_uri())
