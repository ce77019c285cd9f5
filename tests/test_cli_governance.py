"""Tests of the governance commands of msm_mem.interfaces.cli (consent, audit, keys, maintain),
run in-process with explicit principals; the audit trail is read through the FHIR export."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import AccessDenied, ConsentDenied, MsmMem, NotFound, Principal
from msm_mem.interfaces.cli.credential import issue_admin_key
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import ADMIN, ADMIN_P, AGENT, AUDITOR, CLINICIAN, SYSTEM, audit_trail, run
from tests.helpers import png as _png

ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"
AGENT_P = Principal("agent-1", "agent")
CRITIC_P = Principal("rad-1", "critic")


#: settings and identity come from MSM_MEM_* variables: every test starts without any
pytestmark = pytest.mark.usefixtures("clean_msm_env")


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    """A store with no consent at all, made through the Python API (so without an identity
    file) at the wall-clock time the CLI also uses; its admin credential issued as init does."""
    directory = tmp_path / "s"
    MsmMem.init(directory, ADMIN_P, clock=FixedClock(time.time()), policy=[]).close()
    issue_admin_key(directory, ADMIN_P)
    yield directory


def _asked(tmp_path: Path, clock: FixedClock, *patients: str) -> Path:
    """A store (default consent policy) where the agent asked once about each patient."""
    directory = tmp_path / "s"
    with MsmMem.init(directory, ADMIN_P, clock=clock, backbone=FixedBackbone(ANSWER, "treat")) as mem:
        for i, patient in enumerate(patients):
            mem.ask(AGENT_P, patient, _png(tmp_path, i + 1), "Any consolidation?", study_id="S1")
    issue_admin_key(directory, ADMIN_P)
    return directory


def _grant(capsys: pytest.CaptureFixture[str], directory: Path, *extra: str) -> str:
    code, out, err = run(
        capsys,
        "consent",
        "grant",
        directory,
        "--patient",
        "P1",
        "--grantee",
        "role:agent",
        "--purpose",
        "treatment",
        *ADMIN,
        *extra,
    )
    assert code == 0, err
    consent_id = out.strip()
    assert consent_id.startswith("C-")
    return consent_id


def _list(capsys: pytest.CaptureFixture[str], directory: Path, *extra: str) -> str:
    code, out, err = run(capsys, "consent", "list", directory, *extra)
    assert code == 0, err
    return out


def test_consent_grant_list_revoke(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """grant prints the new id, list shows it with its fields, revoke marks it revoked."""
    consent_id = _grant(capsys, store_dir, "--classes", "episodic,visual")
    (line,) = [x for x in _list(capsys, store_dir, *ADMIN).splitlines() if x.startswith(consent_id)]
    assert "permit patient=P1 grantee=role:agent purpose=treatment classes=episodic,visual until=open" in line
    assert "revoked" not in line
    code, out, _ = run(capsys, "consent", "revoke", store_dir, consent_id, *ADMIN)
    assert code == 0 and consent_id in out
    assert "revoked" in _list(capsys, store_dir, "--patient", "P1", *ADMIN)
    assert _list(capsys, store_dir, "--patient", "P2", *ADMIN) == ""


def test_consent_grant_deny_and_period(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--deny records a deny; --start/--end set the period in UTC (as list --json shows)."""
    deny = _grant(capsys, store_dir, "--deny")
    bounded = _grant(capsys, store_dir, "--start", "2020-01-01T00:00:00Z", "--end", "2021-01-01T00:00:00Z")
    records = {c["consent_id"]: c for c in json.loads(_list(capsys, store_dir, "--json", *ADMIN))}
    assert records[deny]["decision"] == "deny"
    assert (records[bounded]["start"], records[bounded]["end"]) == (1577836800.0, 1609459200.0)
    assert "until=2021-01-01T00:00:00+00:00" in _list(capsys, store_dir, *ADMIN)


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
    code, _, err = run(
        capsys, "consent", "grant", store_dir, "--patient", "P1", "--purpose", "treatment", *argv, *ADMIN
    )
    assert code == 1 and err.startswith("error:")
    assert _list(capsys, store_dir, *ADMIN) == ""


def test_consent_grant_by_a_clinician_is_refused_and_audited(
    store_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the admin grants consent: a clinician's grant exits 1, stores nothing, and the
    refusal is in the audit trail under the clinician's id."""
    argv = ["consent", "grant", store_dir, "--patient", "P1", "--grantee", "role:agent", "--purpose", "research"]
    code, _, err = run(capsys, *argv, *CLINICIAN)
    assert code == 1 and "may not consent_grant" in err
    assert _list(capsys, store_dir, *ADMIN) == ""
    denied = [e for e in audit_trail(store_dir) if e.outcome == "denied"]
    assert [(e.action, e.actor, e.role) for e in denied] == [("consent_grant", "dr-who", "clinician")]


def test_consent_revoke_unknown_id(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Revoking an unknown consent exits 1."""
    code, _, err = run(capsys, "consent", "revoke", store_dir, "C-nope", *ADMIN)
    assert code == 1 and "C-nope" in err


def test_auditor_lists_consent_under_pseudonyms(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An auditor's consent list (text and JSON) names each patient by the audit trail's
    pseudonym, never the patient id; the admin's names the patient."""
    consent_id = _grant(capsys, store_dir)
    assert "patient=P1 " in _list(capsys, store_dir, *ADMIN)
    text = _list(capsys, store_dir, *AUDITOR)
    (line,) = text.splitlines()
    assert line.startswith(consent_id) and "P1" not in text and "patient=pt-" in line
    (record,) = json.loads(_list(capsys, store_dir, "--json", *AUDITOR))
    assert record["patient_id"].startswith("pt-") and "P1" not in json.dumps(record)
    grants = [e for e in audit_trail(store_dir) if e.action == "consent_grant"]
    assert [e.patient for e in grants] == [record["patient_id"]]  # the same pseudonym as the trail's


def test_missing_required_option_is_usage_error(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys shred without --reason is a usage error (exit 2)."""
    assert run(capsys, "keys", "shred", store_dir, "--patient", "P1", *ADMIN)[0] == 2


def test_cli_consent_decides_in_process_turns(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CLI grant permits the agent's turn; a CLI revoke seen by an already-open handle denies the next."""
    clock = FixedClock(time.time() + 60)
    consent_id = _grant(capsys, store_dir)
    mem = MsmMem.open(store_dir, clock=clock, backbone=FixedBackbone(ANSWER, "treat"))
    try:
        mem.ask(AGENT_P, "P1", _png(store_dir.parent, 1), "Any consolidation?")
        with pytest.raises(ConsentDenied):
            mem.ask(AGENT_P, "P2", _png(store_dir.parent, 2), "Any consolidation?")
        assert run(capsys, "consent", "revoke", store_dir, consent_id, *ADMIN)[0] == 0
        clock.advance(3600)
        with pytest.raises(ConsentDenied):
            mem.ask(AGENT_P, "P1", _png(store_dir.parent, 3), "Any consolidation?")
    finally:
        mem.close()


def test_audit_checkpoint_then_verify(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """checkpoint signs the head (the grant) and is audited itself; verify reports the count and
    exits 0 (also as an auditor, and as JSON)."""
    _grant(capsys, store_dir)
    code, out, _ = run(capsys, "audit", "checkpoint", store_dir, *ADMIN)
    assert code == 0 and "size 1" in out
    code, out, _ = run(capsys, "audit", "verify", store_dir, *AUDITOR)
    assert code == 0 and "intact: 2 events" in out
    lines = (store_dir / "audit" / "checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(line)["size"] for line in lines][-2:] == [1, 2]  # the one it signed, then its own event
    code, out, _ = run(capsys, "audit", "verify", store_dir, "--json", *ADMIN)
    report = json.loads(out)
    assert code == 0 and report["ok"] is True and report["count"] == 2 and report["first_bad_seq"] is None


def test_audit_verify_exits_3_on_a_tampered_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Editing one stored audit event (straight in the SQLite file) makes verify exit 3 naming
    its seq, and audit export refuses the broken chain."""
    directory = _asked(tmp_path, FixedClock(time.time()), "P1")
    assert run(capsys, "audit", "verify", directory, *AUDITOR)[0] == 0
    with sqlite3.connect(directory / "msm-mem.sqlite") as conn:
        seq, payload = conn.execute("SELECT seq, payload FROM audit ORDER BY seq LIMIT 1 OFFSET 2").fetchone()
        forged = bytes(payload).replace(b'"success"', b'"failure"', 1)
        assert forged != bytes(payload)
        conn.execute("UPDATE audit SET payload = ? WHERE seq = ?", (forged, seq))
    conn.close()
    code, out, _ = run(capsys, "audit", "verify", directory, *AUDITOR)
    assert code == 3 and f"first bad seq {seq}" in out
    code, _, err = run(capsys, "audit", "export", directory, "--fhir", tmp_path / "a.ndjson", *AUDITOR)
    assert code == 1 and "broken" in err and not (tmp_path / "a.ndjson").exists()


def test_audit_export_writes_fhir_and_is_refused_to_an_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """audit export --fhir writes one AuditEvent a line (as an auditor); an agent is refused."""
    directory = _asked(tmp_path, FixedClock(time.time()), "P1")
    code, out, err = run(capsys, "audit", "export", directory, "--fhir", tmp_path / "a.ndjson", *AUDITOR)
    assert code == 0, err
    lines = (tmp_path / "a.ndjson").read_text(encoding="utf-8").splitlines()
    assert lines and all(json.loads(x)["resourceType"] == "AuditEvent" for x in lines)
    assert f"exported {len(lines)} AuditEvent" in out and "P1" not in "".join(lines)
    code, _, err = run(capsys, "audit", "export", directory, "--fhir", tmp_path / "b.ndjson", *AGENT)
    assert code == 1 and "may not audit_export" in err


def test_maintain_prints_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """maintain (as the system role) prints a JSON report and checkpoints the chain."""
    directory = tmp_path / "s"
    with MsmMem.init(
        directory, ADMIN_P, clock=FixedClock(time.time() - 3 * 86400), backbone=FixedBackbone(ANSWER)
    ) as mem:
        mem.ask(AGENT_P, "P1", _png(tmp_path, 1), "Any consolidation?")
        mem.ask(AGENT_P, "P1", _png(tmp_path, 1), "Again?")  # held, expires with the store's one-day TTL
    code, out, _ = run(capsys, "maintain", directory, *SYSTEM)
    assert code == 0
    report = json.loads(out)
    assert set(report) == {"expired", "consolidated", "discarded", "anonymized", "retracted", "checkpoint"}
    assert report["expired"] == 1 and report["anonymized"] == 0
    with MsmMem.open(directory) as mem:  # the checkpoint signs the chain up to maintain's own event
        assert 1 <= report["checkpoint"][0] <= mem.verify_audit(ADMIN_P).count
    assert run(capsys, "audit", "verify", directory, *ADMIN)[0] == 0


def test_maintain_by_an_admin_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """maintenance is the system role's: the store's admin identity (by flags) is refused."""
    directory = _asked(tmp_path, FixedClock(time.time()), "P1")
    code, _, err = run(capsys, "maintain", directory, *ADMIN)
    assert code == 1 and "may not maintain" in err


def test_keys_shred_then_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys shred retracts the patient's records, audits the reason, and the chain still verifies."""
    directory = _asked(tmp_path, FixedClock(time.time()), "P1", "P2")
    code, out, _ = run(capsys, "keys", "shred", directory, "--patient", "P1", "--reason", "erasure request", *ADMIN)
    assert code == 0 and "records retracted" in out
    with MsmMem.open(directory) as mem:
        with pytest.raises((AccessDenied, NotFound), match="shredded"):
            mem.feedback(CRITIC_P, "P1", "S1", accept=True)
        assert len(mem.episodes(Principal("dr-who", "clinician"), "P2")) == 1
    shreds = [e for e in audit_trail(directory) if e.action == "retract"]
    assert {(e.actor, e.role, e.purpose, e.outcome) for e in shreds} == {("admin-1", "admin", "erasure", "success")}
    assert run(capsys, "audit", "verify", directory, *ADMIN)[0] == 0


def test_keys_shred_by_an_agent_is_refused_and_audited(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`keys shred --role agent` exits 1 with one error line, shreds nothing, and the denial is
    in the audit trail under the agent's id."""
    directory = _asked(tmp_path, FixedClock(time.time()), "P1")
    code, out, err = run(capsys, "keys", "shred", directory, "--patient", "P1", "--reason", "because", *AGENT)
    assert code == 1 and out == ""
    assert err == "error: role 'agent' may not shred: only admin\n"
    with MsmMem.open(directory) as mem:
        assert len(mem.episodes(Principal("dr-who", "clinician"), "P1")) == 1
    denied = [e for e in audit_trail(directory) if e.outcome == "denied"]
    assert [(e.action, e.actor, e.role) for e in denied] == [("shred", "agent-1", "agent")]


def test_keys_rotate_records_its_reason(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys rotate rewraps the data keys as the admin; the rotation is audited."""
    code, out, _ = run(capsys, "keys", "rotate", store_dir, "--reason", "annual", *ADMIN)
    assert code == 0 and out.startswith("rotated:")
    rotations = [e for e in audit_trail(store_dir) if e.action == "key_rotate"]
    assert [(e.actor, e.role) for e in rotations] == [("admin-1", "admin")]
    assert run(capsys, "audit", "verify", store_dir, *ADMIN)[0] == 0
