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
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from msm_mem._governance.crypto import EnvelopeCipher
from msm_mem._governance.envelope_codec import EnvelopeCodec
from msm_mem._storage.base import Store
from msm_mem._storage.sqlite import SqliteStore, vector_index
from msm_mem.testing import FixedClock, InMemoryKeyProvider, local_server
from tests.cli_support import clean_env, without_msm_env
from tests.cli_support import make_store as make_cli_store

settings.register_profile("default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

#: the key home of every store the tests make (msm_mem._governance.key_home): a folder of this
#: run, through the configuration folder the default home derives from, so that it holds for
#: tests that clear the MSM_MEM_* variables and for the processes they start (a spawned process
#: imports this module again and keeps its parent's folder)
_CONFIG_PREFIX = "msm-mem-test-config-"
if not Path(os.environ.get("XDG_CONFIG_HOME", "")).name.startswith(_CONFIG_PREFIX):
    _CONFIG_HOME = tempfile.mkdtemp(prefix=_CONFIG_PREFIX)
    os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
    atexit.register(shutil.rmtree, _CONFIG_HOME, True)

#: set by ``make test``: there every test must run, so one that would skip (absent ../shared data,
#: a missing optional extra, no PostgreSQL server) fails with the skip's reason instead; a plain
#: ``pytest`` on a fresh clone skips such tests and says why
REQUIRE_ALL = os.environ.get("MSM_MEM_REQUIRE_ALL", "") not in ("", "0")


def _fail_a_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but MSM_MEM_REQUIRE_ALL is set (`make test`): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under MSM_MEM_REQUIRE_ALL a skipped test is reported as failed, with the skip's reason."""
    outcome = yield
    _fail_a_skip(outcome.get_result())  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a whole module skipped while it is collected."""
    outcome = yield
    _fail_a_skip(outcome.get_result())  # type: ignore[attr-defined]


DIM = 16

StoreFactory = Callable[..., Store]


#: the KEKs of every test store, so that a store reopened in a test reads what it wrote
KEKS = InMemoryKeyProvider()


def envelope_codec(store: Store, provider: InMemoryKeyProvider = KEKS) -> EnvelopeCodec:
    """The governed API's codec for ``store`` (KEKs in memory): a store holds PHI only encrypted."""
    return EnvelopeCodec(EnvelopeCipher(store.store_id, provider, store.keys()), store.keys())


#: the row digest key of every test store that is not opened through MsmMem
ROW_KEY = bytes(range(32))


def with_codec(store: Store) -> Store:
    """``store`` given :func:`envelope_codec` and :data:`ROW_KEY`, ready to hold PHI."""
    store.use_codec(envelope_codec(store))
    store.use_row_key(ROW_KEY)
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


# Citus: one local cluster (a coordinator, two workers) per test session, started on first use
# from the tree `make cluster-build` makes; a store is a fresh schema on the coordinator, which
# `PostgresStore.create` distributes (it finds the citus extension). It runs the tests of the
# modules marked `cluster` only (pytest_generate_tests below), as the `citus` backend.
CLUSTER_TREE = Path(__file__).resolve().parents[1] / ".cluster" / "pgserver" / "pginstall"
CLUSTER_STAMP = CLUSTER_TREE / ".built-citus-13.2.2-pgvector-0.8.6"
_CITUS: dict[str, Any] = {}  # "cluster" | "error", cached per session


def citus_tree() -> Path:
    """The PostgreSQL tree with Citus and pgvector 0.8 that `make cluster-build` makes; skips
    the test (a failure under MSM_MEM_REQUIRE_ALL) when it is not built."""
    if not CLUSTER_STAMP.exists():
        vendor = SHARED / "vendor"
        hint = "run `make cluster-build`" if vendor.is_dir() else "../shared/vendor (the Citus sources) is absent"
        pytest.skip(f"no Citus build in .cluster/ ({hint})")
    return CLUSTER_TREE


def citus_cluster() -> Any:
    """The session's :class:`~msm_mem.testing._citus.LocalCluster`, started on first use from
    :func:`citus_tree`."""
    tree = citus_tree()
    if "error" in _CITUS:
        raise RuntimeError(_CITUS["error"])
    if "cluster" not in _CITUS:
        from msm_mem.testing._citus import LocalCluster

        parent = Path(tempfile.mkdtemp(prefix="msm-mem-citus-"))
        atexit.register(shutil.rmtree, parent, True)
        cluster = LocalCluster(tree, parent / "cluster", shards=4)
        atexit.register(cluster.close)  # runs before the rmtree above
        try:
            cluster.start()
        except Exception as exc:
            _CITUS["error"] = f"the local Citus cluster did not start: {exc!r}"
            raise
        _CITUS["cluster"] = cluster
    return _CITUS["cluster"]


def citus_dsn() -> str:
    """The coordinator's DSN of the session's Citus cluster."""
    return str(citus_cluster().dsn())


@pytest.fixture(scope="session")
def cluster_tree() -> Path:
    """:func:`citus_tree`: the built tree, without starting the cluster."""
    return citus_tree()


@pytest.fixture(scope="session")
def cluster() -> Any:
    """The session's local Citus cluster (:func:`citus_cluster`)."""
    return citus_cluster()


#: the `citus` backend's governed stores keep this many patient lanes (audit chains): the
#: cluster suites run the lanes' write path, the layout a hospital spread over workers takes.
#: Its bare stores (the store contract, which writes raw audit rows of one chain) keep one.
CLUSTER_LANES = 4


def _citus_factory(tmp_path: Path) -> StoreFactory:
    from msm_mem._storage.postgres import PostgresStore

    dsn = citus_dsn()

    def make(dim: int = DIM, encoder: str = "test") -> Store:
        schema = f"t{_SESSION}_{uuid.uuid4().hex[:12]}"
        return with_codec(PostgresStore.create(dsn, dim=dim, encoder=encoder, schema=schema))

    return make


BACKENDS: dict[str, Callable[[Path], StoreFactory]] = {"sqlite": _sqlite_factory}
if not SKIP_POSTGRES:
    BACKENDS["postgres"] = _postgres_factory
#: backends that run only the tests of the modules marked `cluster`
CLUSTER_BACKENDS: dict[str, Callable[[Path], StoreFactory]] = {"citus": _citus_factory}
_SERVER_URL: dict[str, Callable[[], str]] = {"postgres": postgres_dsn, "citus": citus_dsn}


def _backend_params(node: Any) -> list[Any]:
    """The store backends a test runs on: every one of BACKENDS, and the cluster's where its
    module (or class, or itself) is marked `cluster`."""
    marks = {"postgres": [pytest.mark.postgres], "citus": [pytest.mark.citus, pytest.mark.system]}
    names = sorted(BACKENDS)
    if node.get_closest_marker("cluster") is not None:
        names += sorted(CLUSTER_BACKENDS)
    return [pytest.param(name, marks=marks.get(name, [])) for name in names]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The backend fixtures (``make_store``, ``new_mem``, ``module_backend``) take one backend
    per test: see :func:`_backend_params`."""
    for name, scope in (("make_store", "function"), ("new_mem", "function"), ("module_backend", "module")):
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, _backend_params(metafunc.definition), indirect=True, scope=scope)


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


@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A factory of empty stores of one backend; every store made is closed afterwards."""
    made: list[Store] = []
    factory = {**BACKENDS, **CLUSTER_BACKENDS}[request.param](tmp_path)

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
    ``codec=False``; with the row digest key either way); every handle opened is closed afterwards."""
    opened: list[Store] = []

    def again(store: Store, *, codec: bool = True) -> Store:
        if isinstance(store, SqliteStore):
            other: Store = SqliteStore.open(store.directory)
        else:
            from msm_mem._storage.postgres import PostgresStore

            assert isinstance(store, PostgresStore)
            other = PostgresStore.open(store._sql.dsn or postgres_dsn(), schema=store.schema)
        opened.append(other)
        if not codec:
            other.use_row_key(ROW_KEY)
            return other
        return with_codec(other)

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


MemFactory = Callable[..., Any]


@pytest.fixture
def new_mem(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemFactory]:
    """A factory of new governed stores (``MsmMem.init`` by the test admin) of one backend:
    ``new_mem("name", **init_options)`` makes ``tmp_path / name``; on PostgreSQL its records
    live in a fresh schema of the session's server. Every store made is closed afterwards."""
    from msm_mem import MsmMem
    from tests.helpers import ADMIN

    made: list[MsmMem] = []

    def make(name: str = "store", **options: Any) -> MsmMem:
        mem = MsmMem.init(tmp_path / name, ADMIN, **mem_options(request.param, **options))
        made.append(mem)
        return mem

    yield make
    for mem in made:
        mem.close()


@pytest.fixture
def backend(new_mem: MemFactory, request: pytest.FixtureRequest) -> str:
    """The backend name of the ``new_mem`` fixture in use (``sqlite``, ``postgres`` or ``citus``)."""
    return str(request.node.callspec.params["new_mem"])


# governed stores that outlive one test (module fixtures) or one example (hypothesis) --------


@pytest.fixture(scope="module")
def module_backend(request: pytest.FixtureRequest) -> str:
    """A store backend name (``sqlite``, ``postgres`` or ``citus``) for a module-scoped governed store;
    pass ``init_options(module_backend)`` to ``MsmMem.init``."""
    return str(request.param)


def mem_options(backend: str, **options: Any) -> dict[str, Any]:
    """``MsmMem.init`` options putting a new governed store on ``backend``: on PostgreSQL the
    session's server and a fresh schema (dropped with the others), as ``new_mem`` does."""
    if backend in _SERVER_URL:
        options.setdefault("database_url", _SERVER_URL[backend]())
        options.setdefault("schema", f"t{_SESSION}_{uuid.uuid4().hex[:12]}")
    if backend == "citus":
        options.setdefault("audit_chains", CLUSTER_LANES)
    return options


@pytest.fixture(scope="session")
def init_options() -> Callable[..., dict[str, Any]]:
    """:func:`mem_options` of this conftest (a test module importing ``tests.conftest`` gets a
    second copy of the module, with its own server cache: take this fixture instead)."""
    return mem_options


# the MCP server tests' servers (built by tests/mcp_support.py) ---------------------------------


@pytest.fixture(scope="module", params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def mcp_http(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A streamable HTTP ``msm-mem mcp`` server per backend for the module, with its keys."""
    from tests.mcp_support import http_server

    root = tmp_path_factory.mktemp(f"mcp-{request.param}")
    if request.param == "postgres":
        yield from http_server(root, postgres_dsn(), f"t{_SESSION}_{uuid.uuid4().hex[:12]}")
    else:
        yield from http_server(root)


@pytest.fixture(scope="module")
def mcp_stdio_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A store with keys of its own for the stdio ``msm-mem mcp`` servers: (root, directory, keys)."""
    from tests.mcp_support import stdio_store

    return stdio_store(tmp_path_factory.mktemp("mcp-stdio"))


# the command-line tests' stores (built by tests/cli_support.py) --------------------------------


@pytest.fixture
def clean_msm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings and identity come from MSM_MEM_* variables: a command-line test module starts
    every test without any (``pytestmark = pytest.mark.usefixtures("clean_msm_env")``)."""
    clean_env(monkeypatch)


@pytest.fixture(scope="module")
def cli_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A store with the manifest ingested once per module through the command line: (store,
    data folder); the tests that change it take a copy (``cli_store``)."""
    saved = without_msm_env()
    try:
        yield make_cli_store(tmp_path_factory.mktemp("cli-base"))
    finally:
        os.environ.update(saved)


@pytest.fixture
def cli_store(cli_base: tuple[Path, Path], tmp_path: Path) -> Path:
    """A private copy of the module's command-line store."""
    return Path(shutil.copytree(cli_base[0], tmp_path / "store"))


@pytest.fixture
def cli_data(cli_base: tuple[Path, Path]) -> Path:
    """The data folder of the module's command-line store (its images and manifest)."""
    return cli_base[1]


@pytest.fixture
def small_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Link vectors into the graph every 4 (the default waits for 1,024), so small stores use it."""
    monkeypatch.setattr(vector_index, "TAIL", 4)
