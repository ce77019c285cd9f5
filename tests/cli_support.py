"""What the command-line tests share: running the CLI in-process, the acting principals as
flags, a small manifest with bad rows, row counts and the audit trail of a store."""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from msm_mem import MsmMem, Principal
from msm_mem.interfaces.cli import main

HEADER = "patient_id,study_id,timestamp,image,question,answer,report,decision"
QUESTION = "What is seen on the chest radiograph?"

#: the acting principals of the tests, as CLI flags
ADMIN = ["--actor", "admin-1", "--role", "admin"]
AGENT = ["--actor", "agent-1", "--role", "agent"]
CLINICIAN = ["--actor", "dr-who", "--role", "clinician"]
CRITIC = ["--actor", "rad-1", "--role", "critic"]
SYSTEM = ["--actor", "cron", "--role", "system"]
AUDITOR = ["--actor", "aud-1", "--role", "auditor"]

ADMIN_P = Principal("admin-1", "admin", "operations")


def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every MSM_MEM_* variable (settings and identity come from them)."""
    for name in list(os.environ):
        if name.startswith("MSM_MEM_"):
            monkeypatch.delenv(name)


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> object:
    """Run a command with --json; it must succeed and print exactly one line of JSON."""
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def one_line_error(err: str) -> str:
    """The single ``error: ...`` line of ``err`` (asserting there is exactly one)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def png(path: Path, seed: int) -> Path:
    """A 64x64 grey PNG with a seeded pattern (different seeds give different images)."""
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((64, 64)) * 255).astype(np.uint8), mode="L").save(path)
    return path


def make_data(folder: Path) -> Path:
    """Four good images, one corrupt one, and a CSV manifest with one malformed row."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        png(folder / f"img{i}.png", i)
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    rows = [
        HEADER,  # line 1
        f"p1,s1,2020-01-01,img0.png,{QUESTION},small left pleural effusion,report,follow up",  # 2
        f"p1,s2,2020-02-01,img1.png,{QUESTION},pleural effusion resolved,,",  # 3
        f"p2,s1,2020-01-05,corrupt.png,{QUESTION},normal chest,,",  # 4: corrupt image
        f"p2,s2,not-a-date,img2.png,{QUESTION},cardiomegaly,,",  # 5: malformed row
        f"p2,s3,2020-03-01,img2.png,{QUESTION},mild cardiomegaly without edema,,",  # 6
    ]
    manifest = folder / "manifest.csv"
    manifest.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return manifest


def make_store(root: Path) -> tuple[Path, Path]:
    """A store initialised by admin-1 (its identity file names them) with the manifest ingested
    by the system role; returns (store, data folder). The environment must hold no MSM_MEM_*."""
    data = root / "data"
    manifest = make_data(data)
    store = root / "store"
    assert main(["init", str(store), *ADMIN]) == 0
    assert main(["ingest", str(store), "--manifest", str(manifest), "--no-progress", *SYSTEM]) == 4  # 2 bad rows
    return store, data


def admin_credential(directory: Path) -> Path:
    """Issue the CLI's admin credential (the key home's admin.key, as ``msm-mem init`` writes it)
    for a store made through the Python API, so that admin commands run on it."""
    from msm_mem.interfaces.cli.credential import issue_admin_key

    return issue_admin_key(directory, ADMIN_P)


def without_msm_env() -> dict[str, str]:
    """Take the MSM_MEM_* variables out of the environment; returns them to put back."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("MSM_MEM_")}
    for k in saved:
        del os.environ[k]
    return saved


def counts(store_dir: Path) -> dict[str, int]:
    """Rows per memory table, read straight from the SQLite file (read-only)."""
    conn = sqlite3.connect(f"file:{store_dir / 'msm-mem.sqlite'}?mode=ro", uri=True)
    try:
        return {k: conn.execute(f"SELECT COUNT(*) FROM {k}").fetchone()[0] for k in ("episodic", "visual", "semantic")}
    finally:
        conn.close()


@dataclass(frozen=True)
class Event:
    """One audit event as the FHIR export gives it."""

    action: str
    outcome: str
    actor: str
    role: str
    purpose: str
    patient: str


def audit_trail(store_dir: Path, admin: Principal = ADMIN_P) -> list[Event]:
    """Every audit event of a store, through the public FHIR export (the export itself is the
    last event)."""
    with tempfile.TemporaryDirectory() as tmp, MsmMem.open(store_dir) as mem:
        out = Path(tmp) / "audit.ndjson"
        mem.export_fhir(admin, out)
        resources = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return [_event(r) for r in resources]


def _event(r: Mapping[str, object]) -> Event:
    def get(value: object, *path: str | int) -> str:
        for step in path:
            if isinstance(step, int):
                value = value[step] if isinstance(value, list) and len(value) > step else None
            else:
                value = value.get(step) if isinstance(value, dict) else None
        return value if isinstance(value, str) else ""

    return Event(
        action=get(r, "code", "text"),
        outcome=get(r, "outcome", "detail", 0, "coding", 0, "code") or "success",
        actor=get(r, "agent", 0, "who", "identifier", "value"),
        role=get(r, "agent", 0, "role", 0, "text"),
        purpose=get(r, "authorization", 0, "text"),
        patient=get(r, "patient", "identifier", "value"),
    )
