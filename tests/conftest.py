"""Shared fixtures: every store backend runs the same contract tests."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from msm_mem import Store
from msm_mem._governance.codec import EnvelopeCodec
from msm_mem._governance.crypto import EnvelopeCipher
from msm_mem._governance.keys import InMemoryKeyProvider
from msm_mem._storage.sqlite import SqliteStore
from msm_mem.testing import FixedClock, local_server

settings.register_profile("default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DIM = 16

StoreFactory = Callable[..., Store]


#: the KEKs of every test store, so that a store reopened in a test reads what it wrote
KEKS = InMemoryKeyProvider()


def envelope_codec(store: Store, provider: InMemoryKeyProvider = KEKS) -> EnvelopeCodec:
    """The governed API's codec for ``store`` (KEKs in memory): a store holds PHI only encrypted."""
    return EnvelopeCodec(EnvelopeCipher(store.tenant, provider, store.keys()), store.keys())


def with_codec(store: Store) -> Store:
    """``store`` given :func:`envelope_codec`, ready to hold PHI."""
    store.use_codec(envelope_codec(store))
    return store


def _sqlite_factory(tmp_path: Path) -> StoreFactory:
    counter = iter(range(10**6))

    def make(dim: int = DIM, encoder: str = "test") -> Store:
        return with_codec(SqliteStore.create(tmp_path / f"store{next(counter)}", dim=dim, encoder=encoder))

    return make


# PostgreSQL: one server per test session (MSM_MEM_DATABASE_URL, else one started with
# pgserver), one fresh schema per store. When the server cannot start, every postgres test
# fails with the reason; people without pgserver opt out with MSM_MEM_SKIP_POSTGRES=1.
SKIP_POSTGRES = os.environ.get("MSM_MEM_SKIP_POSTGRES", "") not in ("", "0")
_PG: dict[str, object] = {}  # "dsn" | "error" | "seconds" (server start time), cached per session


def postgres_dsn() -> str:
    """The test session's PostgreSQL DSN, starting a throwaway pgserver on first use."""
    if "error" in _PG:
        raise RuntimeError(str(_PG["error"]))
    if "dsn" not in _PG:
        url = os.environ.get("MSM_MEM_DATABASE_URL", "")
        if url:
            _PG["dsn"] = url
            atexit.register(_drop_test_schemas, url)
            return url
        start = time.perf_counter()
        try:
            parent = tempfile.mkdtemp(prefix="msm-mem-pg-")
            atexit.register(shutil.rmtree, parent, True)  # runs after pgserver's own exit handler
            dsn = local_server(Path(parent) / "data", delete_at_exit=True)
            _relax_durability(dsn)
            _PG["dsn"] = dsn
        except Exception as exc:
            _PG["error"] = (
                f"the 'postgres' store backend could not start a server ({exc!r}); set "
                "MSM_MEM_DATABASE_URL to use an existing server, or MSM_MEM_SKIP_POSTGRES=1 "
                "to leave the backend out"
            )
            raise RuntimeError(str(_PG["error"])) from exc
        _PG["seconds"] = time.perf_counter() - start
    return str(_PG["dsn"])


_SESSION = uuid.uuid4().hex[:8]


def _relax_durability(dsn: str) -> None:
    """The throwaway test server need not survive a power cut: skip fsync (much faster DDL)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")


def _drop_test_schemas(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"t{_SESSION}%",)).fetchall()
        for (name,) in rows:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def _postgres_factory(tmp_path: Path) -> StoreFactory:
    from msm_mem._storage.postgres import PostgresStore

    dsn = postgres_dsn()

    def make(dim: int = DIM, encoder: str = "test") -> Store:
        schema = f"t{_SESSION}_{uuid.uuid4().hex[:12]}"
        return with_codec(PostgresStore.create(dsn, dim=dim, encoder=encoder, schema=schema))

    return make


BACKENDS: dict[str, Callable[[Path], StoreFactory]] = {"sqlite": _sqlite_factory}
if not SKIP_POSTGRES:
    BACKENDS["postgres"] = _postgres_factory


@pytest.fixture
def pg_schema() -> str:
    """A fresh PostgreSQL schema name, dropped at the end of the session with the others."""
    return f"t{_SESSION}_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The session's PostgreSQL DSN (fails, not skips, when no server can be had)."""
    if SKIP_POSTGRES:
        pytest.skip("MSM_MEM_SKIP_POSTGRES is set")
    return postgres_dsn()


@pytest.fixture(
    params=[pytest.param(name, marks=[pytest.mark.postgres] if name == "postgres" else []) for name in sorted(BACKENDS)]
)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A factory of empty stores of one backend; every store made is closed afterwards."""
    made: list[Store] = []
    factory = BACKENDS[request.param](tmp_path)

    def make(dim: int = DIM, encoder: str = "test") -> Store:
        store = factory(dim, encoder)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def reopen() -> Iterator[Callable[..., Store]]:
    """Open another handle on a store made by ``make_store`` (with the envelope codec unless
    ``codec=False``); every handle opened is closed afterwards."""
    opened: list[Store] = []

    def again(store: Store, *, codec: bool = True) -> Store:
        if isinstance(store, SqliteStore):
            other: Store = SqliteStore.open(store.directory)
        else:
            from msm_mem._storage.postgres import PostgresStore

            assert isinstance(store, PostgresStore)
            other = PostgresStore.open(postgres_dsn(), schema=store.schema)
        opened.append(other)
        return with_codec(other) if codec else other

    yield again
    for other in opened:
        other.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """One empty store (dimension 16) of each backend."""
    return make_store()


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


def random_unit(rng: np.random.Generator, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal(dim)
    return (v / np.linalg.norm(v)).astype(np.float32)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, skipping the test with a reason when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"../shared/{'/'.join(parts)} is absent (third-party data lives beside the repository)")
    return path
