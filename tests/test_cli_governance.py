"""Tests of the governance commands (msm_mem.interfaces.cli_governance): consent, audit, keys,
maintain, run in-process through ``cli.main``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import Principal
from msm_mem._api.mem import MsmMem
from msm_mem._errors import ConsentDenied
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.helpers import png as _png

ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from MSM_MEM_* variables: start every test without any."""
    for name in list(os.environ):
        if name.startswith("MSM_MEM_"):
            monkeypatch.delenv(name)


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    """A store with no consent at all, made at the wall-clock time the CLI also uses."""
    directory = tmp_path / "s"
    MsmMem.init(directory, clock=FixedClock(time.time()), policy=[]).close()
    yield directory


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _grant(capsys: pytest.CaptureFixture[str], directory: Path, *extra: str) -> str:
    code, out, err = _run(
        capsys,
        "consent",
        "grant",
        str(directory),
        "--patient",
        "P1",
        "--grantee",
        "role:agent",
        "--purpose",
        "treatment",
        *extra,
    )
    assert code == 0, err
    consent_id = out.strip()
    assert consent_id.startswith("C-")
    return consent_id


COMMANDS = [
    ["consent", "grant"],
    ["consent", "revoke"],
    ["consent", "list"],
    ["audit", "verify"],
    ["audit", "checkpoint"],
    ["keys", "rotate"],
    ["keys", "shred"],
    ["maintain"],
]


@pytest.mark.parametrize("argv", COMMANDS)
def test_every_governance_command_has_help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """Each governance command answers --help with exit 0 and a usage text."""
    code, out, _ = _run(capsys, *argv, "--help")
    assert code == 0 and "usage:" in out


def test_consent_grant_list_revoke(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """grant prints the new id, list shows it with its fields, revoke marks it revoked."""
    consent_id = _grant(capsys, store_dir, "--classes", "episodic,visual")
    code, out, _ = _run(capsys, "consent", "list", str(store_dir))
    assert code == 0
    (line,) = [x for x in out.splitlines() if x.startswith(consent_id)]
    assert "permit patient=P1 grantee=role:agent purpose=treatment classes=episodic,visual until=open" in line
    assert "revoked" not in line
    code, out, _ = _run(capsys, "consent", "revoke", str(store_dir), consent_id)
    assert code == 0 and consent_id in out
    out = _run(capsys, "consent", "list", str(store_dir), "--patient", "P1")[1]
    assert "revoked" in out
    assert _run(capsys, "consent", "list", str(store_dir), "--patient", "P2")[1] == ""


def test_consent_grant_deny_and_period(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--deny records a deny; --start/--end set the period in UTC."""
    deny = _grant(capsys, store_dir, "--deny")
    bounded = _grant(capsys, store_dir, "--start", "2020-01-01T00:00:00Z", "--end", "2021-01-01T00:00:00Z")
    with MsmMem.open(store_dir) as mem:
        records = {c.consent_id: c for c in mem._store.consents("P1")}
    assert records[deny].decision == "deny"
    assert (records[bounded].start, records[bounded].end) == (1577836800.0, 1609459200.0)
    out = _run(capsys, "consent", "list", str(store_dir))[1]
    assert "until=2021-01-01T00:00:00+00:00" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--grantee", "agent"],
        ["--grantee", "role:agent", "--start", "not a time"],
        ["--grantee", "role:agent", "--start", "2021-01-01", "--end", "2020-01-01"],
    ],
)
def test_consent_grant_refuses_bad_input(store_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """Malformed consent input exits 1 with one error line and stores nothing."""
    code, _, err = _run(capsys, "consent", "grant", str(store_dir), "--patient", "P1", "--purpose", "treatment", *argv)
    assert code == 1 and err.startswith("error:")
    assert _run(capsys, "consent", "list", str(store_dir))[1] == ""


def test_consent_revoke_unknown_id(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Revoking an unknown consent exits 1."""
    code, _, err = _run(capsys, "consent", "revoke", str(store_dir), "C-nope")
    assert code == 1 and "C-nope" in err


def test_missing_required_option_is_usage_error(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys shred without --reason is a usage error (exit 2)."""
    assert _run(capsys, "keys", "shred", str(store_dir), "--patient", "P1")[0] == 2


def test_cli_consent_decides_in_process_turns(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CLI grant permits the agent's turn; a CLI revoke seen by an already-open handle denies the next."""
    clock = FixedClock(time.time() + 60)
    consent_id = _grant(capsys, store_dir)
    mem = MsmMem.open(store_dir, clock=clock)
    try:
        mem._agent.backbone = FixedBackbone(ANSWER, "treat")
        mem.ask("P1", _png(store_dir.parent, 1), "Any consolidation?")
        with pytest.raises(ConsentDenied):
            mem.ask("P2", _png(store_dir.parent, 2), "Any consolidation?")
        assert _run(capsys, "consent", "revoke", str(store_dir), consent_id)[0] == 0
        clock.advance(3600)
        with pytest.raises(ConsentDenied):
            mem.ask("P1", _png(store_dir.parent, 3), "Any consolidation?")
    finally:
        mem.close()


def test_audit_checkpoint_then_verify(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """checkpoint signs the head; verify reports the count and exits 0."""
    _grant(capsys, store_dir)
    code, out, _ = _run(capsys, "audit", "checkpoint", str(store_dir))
    assert code == 0 and "size 1" in out
    code, out, _ = _run(capsys, "audit", "verify", str(store_dir))
    assert code == 0 and "intact: 1 events" in out
    assert (store_dir / "audit" / "checkpoints.jsonl").read_text().count("\n") == 1


def test_maintain_prints_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """maintain prints a JSON report and checkpoints the chain."""
    directory = tmp_path / "s"
    with MsmMem.init(directory, clock=FixedClock(time.time() - 3 * 86400)) as mem:
        mem._agent.backbone = FixedBackbone(ANSWER, "treat")
        mem.ask("P1", _png(tmp_path, 1), "Any consolidation?")
        mem.ask("P1", _png(tmp_path, 1), "Again?")  # held, expires with the store's one-day TTL
    code, out, _ = _run(capsys, "maintain", str(directory))
    assert code == 0
    report = json.loads(out)
    assert set(report) == {"expired", "consolidated", "discarded", "anonymized", "retracted", "checkpoint"}
    assert report["expired"] == 1 and report["anonymized"] == 0
    with MsmMem.open(directory) as mem:
        assert report["checkpoint"][0] == mem._store.audit_head()[0]
    assert _run(capsys, "audit", "verify", str(directory))[0] == 0


def test_keys_shred_then_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys shred retracts the patient's records, audits the reason, and the chain still verifies."""
    directory = tmp_path / "s"
    with MsmMem.init(directory, clock=FixedClock(time.time())) as mem:
        mem._agent.backbone = FixedBackbone(ANSWER, "treat")
        mem.ask("P1", _png(tmp_path, 1), "Any consolidation?")
    code, out, _ = _run(capsys, "keys", "shred", str(directory), "--patient", "P1", "--reason", "erasure request")
    assert code == 0 and "records retracted" in out
    with MsmMem.open(directory) as mem:
        assert mem._store.record_ids("episodic", "P1") == []
        with pytest.raises(Exception, match="shredded"):
            mem._maintainer().critic_verdict(Principal("rad", "critic"), "P1", "S1", accept=True)
    assert _run(capsys, "audit", "verify", str(directory))[0] == 0
