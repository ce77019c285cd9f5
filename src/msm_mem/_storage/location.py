"""Where a memory directory keeps its store of record: in the directory, or on a server.

A memory directory (``msm-mem init DIR``) always holds the local key file, the signing key of
the audit checkpoints and the signed checkpoints themselves (kept outside the database on
purpose). Its store of record is one of:

- the embedded store (the default): ``DIR/msm-mem.sqlite`` and its FAISS caches;
- a PostgreSQL schema (pgvector), named by ``DIR/store.json``::

      {"backend": "postgresql", "dsn": "host=db.internal dbname=clinic user=msm", "schema": "msm_mem",
       "tenant": "default"}

  The DSN is written without its password, so the file holds no secret; libpq takes the
  password from ``PGPASSWORD`` or ``~/.pgpass`` as usual. Edit the file when the server
  moves. ``tenant`` (absent: ``"default"``) says whose rows of the schema's tables are this
  directory's store: several directories, one per tenant, may share one schema.

A directory with both, or with a ``store.json`` that does not parse or names an unknown
backend, is refused with :class:`StoreError` naming the file and the problem.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import InvalidInput, MissingExtra, StoreError
from .._private import private_dir, private_file
from .._settings import DEFAULT_EF_SEARCH, DEFAULT_TENANT, PopulationSearch, check_tenant
from .base import Store
from .lanes import check_lanes

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = [
    "LOCATION_FILE",
    "ServerLocation",
    "create_store",
    "is_store",
    "open_store",
    "read_location",
    "remove_new_store",
    "without_password",
]

LOCATION_FILE = "store.json"
SQLITE_FILE = "msm-mem.sqlite"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True, slots=True)
class ServerLocation:
    """A PostgreSQL store: libpq connection string (no password), schema name and tenant."""

    dsn: str
    schema: str = "msm_mem"
    tenant: str = DEFAULT_TENANT

    def __post_init__(self) -> None:
        if not isinstance(self.dsn, str) or not self.dsn.strip():
            raise InvalidInput("the database URL must be a non-empty string")
        if not isinstance(self.schema, str) or not _SCHEMA_NAME.fullmatch(self.schema):
            raise InvalidInput(
                f"schema name {self.schema!r}: use 1 to 63 lowercase letters, digits and underscores, "
                "not starting with a digit"
            )
        check_tenant(self.tenant)


def without_password(dsn: str) -> str:
    """``dsn`` (a URL or ``key=value`` string) as ``key=value`` pairs without its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
    except ImportError as exc:
        raise MissingExtra("psycopg", "postgres") from exc
    try:
        params = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg.ProgrammingError for a malformed string
        raise InvalidInput(f"not a PostgreSQL connection string: {exc}") from exc
    params.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in params.items()})


def _postgres_store() -> type[PostgresStore]:
    try:
        from .postgres import PostgresStore
    except ImportError as exc:  # psycopg is the optional extra
        raise MissingExtra("psycopg", "postgres") from exc
    return PostgresStore


def is_store(directory: Path) -> bool:
    """Whether ``directory`` holds a memory store (either kind)."""
    return (directory / SQLITE_FILE).exists() or (directory / LOCATION_FILE).exists()


def read_location(directory: Path) -> ServerLocation | None:
    """The server location of ``directory``, or None for the embedded store.

    Raises :class:`StoreError` for a directory that is no store, holds both kinds, or whose
    ``store.json`` is malformed."""
    path = directory / LOCATION_FILE
    has_sqlite = (directory / SQLITE_FILE).exists()
    if not path.exists():
        if not has_sqlite:
            raise StoreError(f"{directory} is not an msm-mem store (no {SQLITE_FILE}); run `msm-mem init`")
        return None
    if has_sqlite:
        raise StoreError(f"{directory} holds both {SQLITE_FILE} and {LOCATION_FILE}; keep one of them")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(spec, dict) or spec.get("backend") != "postgresql":
        backend = spec.get("backend") if isinstance(spec, dict) else None
        raise StoreError(f"{path}: backend must be 'postgresql', got {backend!r}")
    unknown = sorted(set(spec) - {"backend", "dsn", "schema", "tenant"})
    if unknown:
        raise StoreError(f"{path}: unknown keys {unknown}")
    dsn, schema, tenant = spec.get("dsn"), spec.get("schema", "msm_mem"), spec.get("tenant", DEFAULT_TENANT)
    if not isinstance(dsn, str) or not isinstance(schema, str):
        raise StoreError(f"{path}: 'dsn' and 'schema' must be strings")
    if not isinstance(tenant, str):
        raise StoreError(f"{path}: 'tenant' must be a string")
    try:
        return ServerLocation(dsn, schema, tenant)
    except InvalidInput as exc:
        raise StoreError(f"{path}: {exc}") from exc


def _write_location(directory: Path, location: ServerLocation) -> None:
    path = directory / LOCATION_FILE
    tmp = path.with_suffix(".json.tmp")
    spec = {"backend": "postgresql", "dsn": location.dsn, "schema": location.schema, "tenant": location.tenant}
    private_file(tmp).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def create_store(
    directory: Path,
    *,
    dim: int,
    encoder: str,
    server: ServerLocation | None = None,
    population_search: PopulationSearch = "exact",
    ef_search: int = DEFAULT_EF_SEARCH,
    tenant: str = DEFAULT_TENANT,
    lanes: int = 1,
) -> Store:
    """Create the store of record of a new memory directory (made if missing), of ``tenant``,
    its patients in ``lanes`` lanes (``lanes.py``: a server store only; embedded, one).

    Embedded by default; with ``server``, a new store in that PostgreSQL schema (of the
    server's tenant: ``tenant`` is not used then), and ``store.json`` pointing at it (the
    password left out of the file). Refuses a directory that holds a store already.
    ``population_search`` (and, embedded, ``ef_search``): how the store searches the whole
    population (see :class:`msm_mem.Settings`)."""
    if directory.exists() and not directory.is_dir():
        raise StoreError(f"{directory} exists and is not a directory")
    if is_store(directory):
        raise StoreError(f"{directory} already holds a store")
    if check_lanes(lanes) != 1 and server is None:
        raise InvalidInput("an embedded store keeps one audit chain: several need a PostgreSQL store (database_url)")
    if server is None:
        from .sqlite import SqliteStore

        return SqliteStore.create(
            directory,
            dim=dim,
            encoder=encoder,
            population_search=population_search,
            ef_search=ef_search,
            tenant=tenant,
        )
    postgres = _postgres_store()
    stored = ServerLocation(without_password(server.dsn), server.schema, server.tenant)
    store = postgres.create(
        server.dsn,
        dim=dim,
        encoder=encoder,
        schema=server.schema,
        population_search=population_search,
        tenant=server.tenant,
        lanes=lanes,
    )
    try:  # the directory only once the server has the store: a refused init leaves nothing
        private_dir(directory)
        _write_location(directory, stored)
    except BaseException:
        store.drop()
        raise
    return store


def remove_new_store(directory: Path, store: Store) -> None:
    """Undo :func:`create_store`: drop a server store's tables (its schema too when that is
    left empty) or delete the embedded database files, then the location file. Only for a
    store that was just made: everything in it is lost."""
    from .sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        store.close()
    else:
        postgres = _postgres_store()
        if not isinstance(store, postgres):
            raise InvalidInput(f"not a store this module makes: {type(store).__name__}")
        store.drop()
    for name in (SQLITE_FILE, f"{SQLITE_FILE}-wal", f"{SQLITE_FILE}-shm", LOCATION_FILE):
        (directory / name).unlink(missing_ok=True)


def open_store(
    directory: Path,
    *,
    dsn: str | None = None,
    upgrading: bool = False,
    population_search: PopulationSearch = "exact",
    ef_search: int = DEFAULT_EF_SEARCH,
    tenant: str | None = None,
) -> Store:
    """Open the store of record of a memory directory (see the module docstring).

    ``dsn`` replaces the connection string of ``store.json`` for this opening (for example
    one with a password); an embedded store refuses it (InvalidInput). ``upgrading`` opens a
    store of an older schema too, for :meth:`~msm_mem._storage.base.Store.upgrade` only.
    ``population_search`` and ``ef_search`` as for :func:`create_store`. ``tenant``, when
    given, must be the directory's (InvalidInput otherwise); an embedded store of an older
    schema gets it in its upgrade."""
    if tenant is not None:
        check_tenant(tenant)
    server = read_location(directory)
    if server is None:
        if dsn is not None:
            raise InvalidInput(f"{directory} is an embedded store: a database URL does not apply to it")
        from .sqlite import SqliteStore

        return SqliteStore.open(
            directory, upgrading=upgrading, population_search=population_search, ef_search=ef_search, tenant=tenant
        )
    if tenant is not None and tenant != server.tenant:
        raise InvalidInput(f"{directory} is the store of tenant {server.tenant!r}, not {tenant!r}")
    postgres = _postgres_store()
    try:
        return postgres.open(
            dsn or server.dsn,
            schema=server.schema,
            upgrading=upgrading,
            population_search=population_search,
            tenant=server.tenant,
        )
    except StoreError as exc:
        if dsn is None and "password" in str(exc):
            raise StoreError(
                f"{exc} ({directory / LOCATION_FILE} holds no password: set PGPASSWORD or use ~/.pgpass)"
            ) from exc
        raise


def store_id_of(directory: Path, *, dsn: str | None = None, tenant: str | None = None) -> str:
    """The id of the store of ``directory``, read without opening it for use: an embedded
    store's from its ``meta`` table (read-only, no index loaded), a server store's from its
    schema. StoreError when there is none."""
    if read_location(directory) is not None:
        store = open_store(directory, dsn=dsn, upgrading=True, tenant=tenant)
        try:
            return store.store_id
        finally:
            store.close()
    import sqlite3

    from .sqlite.upgrade import read_meta

    path = directory / SQLITE_FILE
    if not path.is_file():
        raise StoreError(f"{directory} is not an msm-mem store: check the path, or create one with msm-mem init")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return read_meta(conn, directory, tenant)[1]["store_id"]
    except sqlite3.Error as exc:
        raise StoreError(f"{directory} is not a readable msm-mem store: {exc}") from None
    finally:
        conn.close()
