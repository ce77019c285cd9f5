"""A real ``msm-mem serve`` process on a loopback port, for the service tests: a store made and
filled here, API keys for every role, the server started with ``python -m msm_mem serve`` and
stopped (by its own pid) afterwards. The MCP tests (:mod:`tests.mcp_support`) share its store,
its keys and the process helpers (:func:`launch`, :func:`stop`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from msm_mem import ManifestRow, MsmMem, Principal
from msm_mem.interfaces.auth.apikeys import ApiKeyStore
from tests.helpers import ADMIN, INGEST, png, raw_sql

#: the patients of the service tests (distinctive, so a log or an error body naming one is found)
OWN, OTHER = "PAT-OWN-7", "PAT-OTHER-9"
QUESTION = "What is the impression?"
JWT_SECRET = "a-test-hmac-secret-of-at-least-32-bytes!"
JWT_ISSUER, JWT_AUDIENCE = "https://idp.test", "msm-mem"

#: one key per role, each scoped to OWN; beside them "everyone" (a clinician over every patient),
#: "researcher" (an agent for research, which no consent permits) and "revoked"
ROLES = {
    "agent": Principal("svc-agent", "agent", "treatment"),
    "clinician": Principal("svc-clinician", "clinician", "treatment"),
    "critic": Principal("svc-critic", "critic", "treatment"),
    "system": Principal("svc-system", "system", "operations"),
    "admin": Principal("svc-admin", "admin", "operations"),
    "auditor": Principal("svc-auditor", "auditor", "audit"),
}


@dataclass
class Served:
    """A running server: its URL, store directory, keys by role, log file and process."""

    url: str
    directory: Path
    tokens: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes]
    images: Path
    extra: dict[str, str] = field(default_factory=dict)

    def headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def audit_count(self) -> int:
        return int(raw_sql(self.directory, "SELECT count(*) FROM audit")[0][0])

    def audit_events(self, since: int = 0) -> list[dict[str, Any]]:
        return events(self.directory, since)

    def head_seq(self) -> int:
        return head(self.directory)


def head(directory: Path) -> int:
    """The last audit sequence number of the store (every write appends at least one event)."""
    return int(raw_sql(directory, "SELECT coalesce(max(seq), 0) FROM audit")[0][0])


def events(directory: Path, since: int = 0) -> list[dict[str, Any]]:
    """The audit events after ``since``, oldest first, each with its seq."""
    rows = raw_sql(directory, "SELECT seq, payload FROM audit WHERE seq > ? ORDER BY seq", (since,))
    out = []
    for seq, payload in rows:
        doc = json.loads(bytes(payload))
        doc["seq"] = seq
        out.append(doc)
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_store(root: Path, database_url: str | None = None, schema: str = "msm_mem") -> Path:
    """A store with three studies of OWN and one of OTHER ingested, and a key per role."""
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    directory = root / "store"
    kwargs = {} if database_url is None else {"database_url": database_url, "schema": schema}
    # studies of the last weeks (retention counts from the store's last write, whatever the
    # studies' dates: docs/design.md, "Retention")
    start = float(int(time.time() // 86_400) * 86_400) - 30 * 86_400
    with MsmMem.init(directory, ADMIN, **kwargs) as mem:  # type: ignore[arg-type]
        rows = [
            ManifestRow(
                patient,
                f"S{i}",
                start + i * 86_400,
                str(png(images, i)),
                QUESTION,
                "Right lower lobe consolidation.",
                line=i + 1,
            )
            for i, patient in enumerate([OWN, OWN, OWN, OTHER])
        ]
        mem.ingest(INGEST, rows)
    return directory


def start(
    root: Path,
    directory: Path,
    *,
    workers: int = 1,
    max_upload_mb: int = 1,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Served:
    """Create the keys and start the server (``extra`` flags, ``env`` added to the environment);
    wait (bounded) until it answers."""
    tokens = make_keys(directory)
    secret = root / "jwt.secret"
    secret.write_text(JWT_SECRET)
    port = free_port()
    log = root / "server.log"
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "msm_mem",
        "serve",
        str(directory),
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--max-upload-mb",
        str(max_upload_mb),
        "--max-image-side",
        "2048",
        "--jwt-key",
        str(secret),
        "--jwt-issuer",
        JWT_ISSUER,
        "--jwt-audience",
        JWT_AUDIENCE,
        *extra,
    ]
    url = f"http://127.0.0.1:{port}"
    process = launch(cmd, log, environ, url + "/ready", "the server")
    return Served(url, directory, tokens, log, process, root / "images")


def make_keys(directory: Path) -> dict[str, str]:
    """One key per role scoped to OWN, "everyone" (a clinician over every patient),
    "researcher" (an agent for research, which no consent permits) and "revoked"."""
    keys = ApiKeyStore.of_store(directory)
    tokens = {}
    for role, who in ROLES.items():
        tokens[role], _ = keys.create(who, [OWN])
    tokens["everyone"], _ = keys.create(Principal("svc-all", "clinician", "treatment"), ["*"])
    tokens["researcher"], _ = keys.create(Principal("svc-research", "agent", "research"), [OWN])
    tokens["revoked"], revoked = keys.create(Principal("svc-gone", "agent", "treatment"), [OWN])
    keys.revoke(revoked.key_id)
    return tokens


# server processes (the service's and the MCP server's) ----------------------------------------


class Running(Protocol):
    """A started server: its process."""

    process: subprocess.Popen[bytes]


def launch(cmd: list[str], log: Path, env: Mapping[str, str], ready: str, what: str) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own, its output in ``log``, and wait (bounded) until
    ``ready`` answers 200; a process that exits or does not answer fails naming ``what``."""
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    for _ in range(300):  # at most about a minute
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(ready, timeout=1.0).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_process(process)
    raise RuntimeError(f"{what} did not start: {log.read_text()[-2000:]}")


def stop(served: Running) -> None:
    """Stop the server (its process group: uvicorn's workers with it) and wait for it."""
    stop_process(served.process)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop a process started by :func:`launch` (its process group) and wait for it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def serve_backend(backend: str, root: Path) -> Iterator[Served]:
    """A server over a store of ``backend`` made under ``root`` (embedded: one worker;
    PostgreSQL: two), stopped when the generator is closed; for a module's ``served`` fixture."""
    if backend == "postgres":
        import uuid

        from tests.conftest import _SESSION, postgres_dsn

        directory = make_store(root, postgres_dsn(), f"t{_SESSION}_{uuid.uuid4().hex[:12]}")
        server = start(root, directory, workers=2)
    else:
        server = start(root, make_store(root))
    try:
        yield server
    finally:
        stop(server)
