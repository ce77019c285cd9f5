"""Every ``sh`` and ``python`` block of README.md and docs/*.md runs as printed.

The blocks of one page run in order in one scratch folder that holds generated images
(``xrays/<name>.png`` for every image a written manifest names, and ``cxr.png``). A block
preceded by an HTML comment is treated as it says:

- ``<!-- not run: REASON -->``: not run (a placeholder, a real hospital's server, a
  command that takes hours); the reason is required.
- ``<!-- file: PATH -->``: the block's text is written to PATH in the scratch folder.
- ``<!-- run with: serve -->`` / ``<!-- run with: mcp -->``: run while ``msm-mem serve`` /
  ``msm-mem mcp --transport http`` serves the folder's ``mem/`` on a free port, which takes
  the place of the printed ``127.0.0.1:8080`` / ``127.0.0.1:8765``, and ``msmk_...`` is
  an agent key for P1 and P2.

Any other block in ``sh`` or ``python`` runs unchanged and must exit 0.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from msm_mem import Principal
from msm_mem.interfaces.auth.apikeys import ApiKeyStore
from tests.helpers import png
from tests.http_support import free_port, launch, stop_process
from tests.mcp_support import environment

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"sh", "python"}
SERVERS = {"serve": ("127.0.0.1:8080", "/ready"), "mcp": ("127.0.0.1:8765", "/health")}

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
DIRECTIVE = re.compile(r"<!-- (not run|file|run with): (.*?) -->")


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, line, language, text and the directive before it."""

    page: Path
    line: int
    lang: str
    text: str
    kind: str = ""
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the directive comment on the line before each."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        d = DIRECTIVE.fullmatch(before.strip())
        line = text.count("\n", 0, m.start()) + 1
        kind, arg = (d.group(1), d.group(2).strip()) if d else ("", "")
        out.append(Block(page, line, m.group(1), m.group(2), kind, arg))
    return out


def test_every_block_is_run_or_marked_with_a_reason() -> None:
    """A directive names a reason, a relative path or a known server; README, deploy.md and
    manifest.md carry sh and python blocks, some of them run."""
    runnable = 0
    for page in PAGES:
        for b in blocks(page):
            if b.kind == "not run":
                assert len(b.arg) > 10, f"{b.where}: 'not run' needs a reason"
            elif b.kind == "file":
                assert b.arg and not Path(b.arg).is_absolute() and ".." not in Path(b.arg).parts, b.where
            elif b.kind == "run with":
                assert b.arg in SERVERS, f"{b.where}: unknown server {b.arg!r} (one of {sorted(SERVERS)})"
            if b.lang in RUN and b.kind != "not run":
                runnable += 1
    assert runnable >= 5


def _scratch(folder: Path, block: Block) -> None:
    """Write a file block, and an image for every image a written CSV manifest names."""
    path = folder / block.arg
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.text, encoding="utf-8")
    if path.suffix == ".csv":
        for i, row in enumerate(csv.DictReader(block.text.splitlines())):
            image = (path.parent / row["image"]).resolve()
            image.parent.mkdir(parents=True, exist_ok=True)
            png(folder, 100 + i).rename(image)


def _env(**extra: str) -> dict[str, str]:
    """A server's environment (this checkout's code, no MSM_MEM_*), this interpreter's scripts first."""
    return environment(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]), **extra)


def _run(folder: Path, block: Block, text: str) -> None:
    cmd = ["bash", "-e", "-o", "pipefail", "-c", text] if block.lang == "sh" else [sys.executable, "-c", text]
    done = subprocess.run(cmd, cwd=folder, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{block.where} ({block.lang}) exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def _served(folder: Path, block: Block) -> None:
    """Run ``block`` against a server over ``folder/mem`` started for it, then stop the server."""
    printed, ready = SERVERS[block.arg]
    token, _ = ApiKeyStore.of_store(folder / "mem").create(Principal("docs-agent", "agent", "treatment"), ["P1", "P2"])
    port = free_port()
    cmd = [sys.executable, "-m", "msm_mem", block.arg, str(folder / "mem"), "--port", str(port)]
    cmd += ["--transport", "http"] if block.arg == "mcp" else []
    process = launch(cmd, folder / f"{block.arg}.log", environment(), f"http://127.0.0.1:{port}{ready}", block.arg)
    try:
        _run(folder, block, block.text.replace(printed, f"127.0.0.1:{port}").replace("msmk_...", token))
    finally:
        stop_process(process)


RUNNABLE = [p for p in PAGES if any(b.lang in RUN and b.kind != "not run" for b in blocks(p))]


@pytest.mark.slow
@pytest.mark.system
@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_blocks_run_as_printed(page: Path, tmp_path: Path) -> None:
    """The page's sh and python blocks, in order, in one scratch folder, each exit 0."""
    png(tmp_path, 99).rename(tmp_path / "cxr.png")
    for block in blocks(page):
        if block.kind == "file":
            _scratch(tmp_path, block)
        elif block.lang not in RUN or block.kind == "not run":
            continue
        elif block.kind == "run with":
            _served(tmp_path, block)
        else:
            _run(tmp_path, block, block.text)


def _deploy_block(lang: str) -> str:
    """The first ``lang`` block of docs/deploy.md's PostgreSQL section."""
    found = [b for b in blocks(ROOT / "docs" / "deploy.md") if b.lang == lang]
    assert found, f"docs/deploy.md has no {lang} block"
    return found[0].text


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.system
def test_the_least_privileged_role_of_deploy_md_runs_init_ingest_and_serve(tmp_path: Path) -> None:
    """deploy.md's SQL, run as printed on a fresh database (the role renamed to be unique), gives
    a role without CREATE on the database that can init, ingest into and serve a store."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from tests.conftest import postgres_dsn

    dsn = postgres_dsn()
    role, db = f"msm_{os.getpid()}", f"clinic_{os.getpid()}"
    sql = re.sub(r"\bmsm\b", role, _deploy_block("sql"))
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.execute(f"CREATE DATABASE {db}")
    parts = conninfo_to_dict(dsn)
    query = "&".join(f"{k}={parts[k]}" for k in ("host", "port") if parts.get(k))
    url = f"postgresql://{role}@/{db}" + (f"?{query}" if query else "")
    try:
        with psycopg.connect(dsn, dbname=db, autocommit=True) as superuser:
            superuser.execute(sql)
        with psycopg.connect(url, password="change-me") as conn:  # the role may not create a schema
            allowed = conn.execute("SELECT has_database_privilege(current_user, current_database(), 'CREATE')")
            assert allowed.fetchone() == (False,)
        init = _deploy_block("sh").replace("postgresql://msm@db.internal/clinic", url)
        init = init.replace("/srv/mem", str(tmp_path / "mem"))
        (tmp_path / "studies.csv").write_text(
            "patient_id,study_id,timestamp,image,question,answer\n"
            f"P1,S1,2024-01-02,{png(tmp_path, 1).name},What is the impression?,Small left effusion.\n"
        )
        env = {"PGPASSWORD": "change-me"}
        _shell(tmp_path, init, env)
        _shell(tmp_path, "msm-mem ingest mem/ --manifest studies.csv --no-progress", env)
        _shell(tmp_path, "msm-mem ask mem/ --patient P1 --image-study S1 --question 'What is the impression?'", env)
        port = free_port()
        cmd = [sys.executable, "-m", "msm_mem", "serve", str(tmp_path / "mem"), "--port", str(port)]
        server = launch(cmd, tmp_path / "serve.log", environment(**env), f"http://127.0.0.1:{port}/ready", "serve")
        stop_process(server)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def _shell(folder: Path, text: str, extra: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", "-e", "-c", text], cwd=folder, env=_env(**extra), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{text} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files in ``folder``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.mark.slow
@pytest.mark.system
def test_a_self_signed_certificate_is_trusted_by_naming_it(tmp_path: Path) -> None:
    """deploy.md's TLS: serve --ssl-certfile/--ssl-keyfile with a self-signed certificate;
    MemoryClient(verify=cert.pem) reaches it, the default verification refuses it."""
    from msm_mem import BackendError, MemoryClient

    cert, key = _self_signed(tmp_path)
    _shell(tmp_path, "msm-mem init mem/", {})
    token, _ = ApiKeyStore.of_store(tmp_path / "mem").create(Principal("docs-agent", "agent", "treatment"), ["P1"])
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "msm_mem", "serve", str(tmp_path / "mem"), "--port", str(port)]
    cmd += ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    with (tmp_path / "serve.log").open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    try:
        with MemoryClient(url, token=token, verify=str(cert)) as memory:
            for _ in range(300):  # until the server answers (bounded)
                assert process.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    assert memory.whoami()[0].id == "docs-agent"
                    break
                except BackendError:  # not listening yet
                    time.sleep(0.2)
            assert list(memory.claims("P1")) == []
        with MemoryClient(url, token=token, retries=0) as untrusted, pytest.raises(BackendError, match="CERTIFICATE"):
            untrusted.whoami()
    finally:
        stop_process(process)
