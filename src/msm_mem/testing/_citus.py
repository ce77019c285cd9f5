"""A local Citus cluster for tests and single-machine trials: one coordinator and some workers,
each a PostgreSQL server of one installation tree that has Citus and pgvector built into it
(``make cluster-build`` makes ``.cluster/pg``)::

    with LocalCluster(Path(".cluster/pg"), Path("/tmp/c")) as cluster:
        dsn = cluster.dsn()                 # the coordinator; msm-mem init --database-url dsn

Every node listens on ``127.0.0.1`` only (a free port each, no Unix socket), trusts local
connections (a throwaway cluster: no passwords) and preloads ``citus``; ``citus`` and
``vector`` are created on every node, the coordinator knows itself
(``citus_set_coordinator_host``) and each worker (``citus_add_node``). Run as root, the
servers run as an unprivileged system user (PostgreSQL refuses root), as pgserver does.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from .._errors import StoreError

__all__ = ["LocalCluster", "Node"]

#: the system user the servers run as when this process is root
SERVER_USER = "pgserver"
#: settings of every node; durability stays on (``synchronous_commit``: an acknowledged write
#: survives a node killed with ``pg_ctl stop -m immediate``), ``fsync`` off (the page cache
#: survives a killed server, and a test cluster need not survive a power cut)
_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = ''
max_connections = 200
max_prepared_transactions = 200
shared_buffers = 64MB
fsync = off
full_page_writes = off
synchronous_commit = on
"""
_CITUS_CONF = """
shared_preload_libraries = 'citus'
citus.shard_count = {shards}
citus.recover_2pc_interval = '1s'
"""


@dataclass(frozen=True, slots=True)
class Node:
    """One server of the cluster: its name (``coordinator``, ``worker1``, ...), its port on
    127.0.0.1 and its data directory."""

    name: str
    port: int
    datadir: Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> str | None:
    """The user to run the servers as: None (this process's) unless this process is root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/sh", SERVER_USER], check=True, capture_output=True)
    return SERVER_USER


class LocalCluster:
    """A coordinator and ``workers`` workers started from the installation tree ``pg_root``
    (its ``bin/initdb``, ``bin/pg_ctl``; Citus and pgvector installed in it), with their data
    under ``workdir``. ``shards``: ``citus.shard_count`` of every node (shards per distributed
    table; Citus's default is 32, fewer make a test cluster's DDL faster). With ``citus=False``
    (and no workers) it is one plain PostgreSQL server with pgvector, set up like the nodes: the
    single-server baseline of a benchmark. :meth:`start` (or ``with``) starts it; :meth:`close`
    stops every node."""

    def __init__(self, pg_root: Path, workdir: Path, *, workers: int = 2, shards: int = 32, citus: bool = True) -> None:
        if not citus and workers:
            raise ValueError("a server without citus has no workers")
        self.pg_root = pg_root.resolve()
        self.workdir = workdir.resolve()
        self.shards = shards
        self.citus = citus
        self.user = _server_user()
        names = ["coordinator", *(f"worker{i + 1}" for i in range(workers))]
        self.nodes: dict[str, Node] = {n: Node(n, _free_port(), self.workdir / n) for n in names}
        self._started: set[str] = set()

    # lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [str(self.pg_root / "bin" / args[0]), *args[1:]],
                check=True,
                capture_output=True,
                text=True,
                timeout=timeout,
                user=self.user,
                cwd=self.workdir,
            )
        except subprocess.CalledProcessError as exc:
            raise StoreError(
                f"{args[0]} failed ({exc.returncode}): {exc.stderr.strip() or exc.stdout.strip()}"
            ) from exc

    def start(self) -> None:
        """Initialise, start and join every node (idempotent per node; each ``initdb`` once)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            shutil.chown(self.workdir, self.user)
            # the server user must reach its data and its binaries (as pgserver does)
            for folder in {*self.workdir.parents, *self.pg_root.parents}:
                if folder.stat().st_uid == os.geteuid():
                    folder.chmod(folder.stat().st_mode | 0o011)
        for node in self.nodes.values():
            if not (node.datadir / "PG_VERSION").exists():
                self._run(
                    "initdb",
                    "-D",
                    str(node.datadir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                )
                with open(node.datadir / "postgresql.conf", "a", encoding="utf-8") as conf:
                    conf.write(_CONF.format(port=node.port))
                    if self.citus:
                        conf.write(_CITUS_CONF.format(shards=self.shards))
            self.start_node(node.name)
        if not self.citus:
            self._sql(self.nodes["coordinator"], "CREATE EXTENSION IF NOT EXISTS vector")
            return
        for node in self.nodes.values():
            self._sql(node, "CREATE EXTENSION IF NOT EXISTS citus", "CREATE EXTENSION IF NOT EXISTS vector")
        coordinator = self.nodes["coordinator"]
        statements = [f"SELECT citus_set_coordinator_host('127.0.0.1', {coordinator.port})"]
        statements += [f"SELECT citus_add_node('127.0.0.1', {n.port})" for n in self.workers()]
        self._sql(coordinator, *statements)

    def start_node(self, name: str) -> None:
        """Start one node (stopped by :meth:`stop_node` or not started yet) and wait until it
        takes connections."""
        node = self.nodes[name]
        self._run("pg_ctl", "-D", str(node.datadir), "-l", str(node.datadir / "log"), "-w", "-t", "60", "start")
        self._started.add(name)

    def stop_node(self, name: str, mode: str = "fast") -> None:
        """Stop one node; ``mode`` is ``pg_ctl stop -m``'s (``immediate``: killed, recovered
        from its WAL on the next start)."""
        node = self.nodes[name]
        self._run("pg_ctl", "-D", str(node.datadir), "-m", mode, "-w", "stop")
        self._started.discard(name)

    def close(self) -> None:
        """Stop every node that runs (the data directories stay for the caller to remove)."""
        for name in list(self._started):
            try:
                self.stop_node(name, "immediate")
            except StoreError:
                pass

    # addresses ------------------------------------------------------------------------------

    def workers(self) -> list[Node]:
        """The worker nodes, in the order they joined."""
        return [n for n in self.nodes.values() if n.name != "coordinator"]

    def dsn(self, name: str = "coordinator") -> str:
        """A libpq connection string of one node (the coordinator by default)."""
        return f"host=127.0.0.1 port={self.nodes[name].port} user=postgres dbname=postgres"

    def _sql(self, node: Node, *statements: str) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                conn = psycopg.connect(self.dsn(node.name), autocommit=True)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with conn:
            for statement in statements:
                conn.execute(statement.encode())

    def query(self, name: str, statement: str, *args: Any) -> list[tuple[Any, ...]]:
        """The rows of one statement run on one node (autocommit; none for a statement that
        returns no rows)."""
        import psycopg

        with psycopg.connect(self.dsn(name), autocommit=True) as conn:
            cur = conn.execute(statement.encode(), args or None)
            return list(cur.fetchall()) if cur.description is not None else []

    def shard_of(self, table: str, value: str) -> tuple[str, str]:
        """The worker holding the shard of the distributed ``table`` (schema-qualified) where
        the distribution value ``value`` lives, and that shard's table name on the worker."""
        ((shard,),) = self.query(
            "coordinator", "SELECT get_shard_id_for_distribution_column(%s::regclass, %s::text)", table, value
        )
        ((port,),) = self.query(
            "coordinator",
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid"
            " WHERE p.shardid = %s",
            shard,
        )
        return next(n.name for n in self.workers() if n.port == port), f"{table}_{shard}"

    def value_on(self, table: str, worker: str, prefix: str) -> str:
        """The first of ``prefix0``, ``prefix1``, ... whose shard of ``table`` is on ``worker``."""
        for i in range(1000):
            if self.shard_of(table, f"{prefix}{i}")[0] == worker:
                return f"{prefix}{i}"
        raise StoreError(f"no value {prefix}N of {table} lands on {worker}")
