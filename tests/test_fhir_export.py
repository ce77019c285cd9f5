"""Tests of msm_mem._governance.audit.fhir on a whole store: the export as FHIR R5 AuditEvent resources
(IHE BALP patterns, no patient identifier, the chain carried and re-verified), the verification
of an exported file, writing it, and ``msm-mem audit export`` (the mapping event by event is in
``tests/test_fhir.py``)."""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fhir.resources.auditevent import AuditEvent as FhirAuditEvent
from PIL import Image

import msm_mem
from msm_mem import AuditChainBroken, ConsentDenied, InvalidInput, ManifestRow, Principal, Purpose, Role
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS, AuditEvent
from msm_mem._governance.audit.fhir import CHAIN_EXTENSION, export_fhir, iter_fhir, verify_fhir
from msm_mem._storage.base import Store
from msm_mem._storage.location import open_store
from msm_mem._tier_records import ConsentRecord
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedClock
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.helpers import ADMIN, AGENT, INGEST, copy_store, raw_db
from tests.layers import layers_of
from tests.test_fhir import DCM, OUTCOME_SYSTEM, codes

PATIENT = "PATIENT-SECRET-7731"
QUESTION = "What is seen on the chest radiograph?"


def _png(path: Path, seed: int) -> str:
    """A 64x64 grey PNG with a seeded pattern; returns its absolute path."""
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((64, 64)) * 255).astype(np.uint8), mode="L").save(path)
    return str(path.resolve())


def _build(root: Path, **options: Any) -> Path:
    """A closed store ``root / "s"`` with two ingested studies, one ask, and one consent DENY for research."""
    clock = FixedClock()
    mem = msm_mem.MsmMem.init(root / "s", ADMIN, clock=clock, **options)
    try:
        images = [_png(root / f"i{i}.png", i) for i in range(3)]
        mem.ingest(
            INGEST,
            [
                ManifestRow(PATIENT, "s1", 1.6e9, images[0], QUESTION, "small left pleural effusion", "report"),
                ManifestRow(PATIENT, "s2", 1.61e9, images[1], QUESTION, "pleural effusion resolved"),
            ],
        )
        mem.ask(AGENT, PATIENT, images[2], QUESTION)
        deny = ConsentRecord(
            consent_id="C-deny-research",
            patient_id=PATIENT,
            grantee="actor:x",
            purpose="research",
            decision="deny",
            data_classes=("*",),
            start=0.0,
        )
        mem.grant(ADMIN, [deny])
        with layers_of(mem, clock) as layers, pytest.raises(ConsentDenied):
            layers.gm.begin(Principal("x", Role.AGENT, Purpose.RESEARCH), PATIENT)
    finally:
        mem.close()
    return root / "s"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built store on SQLite (for the command-line tests)."""
    return _build(tmp_path_factory.mktemp("fhir"))


@pytest.fixture()
def store_dir(built: Path, tmp_path: Path) -> Path:
    """A private copy of the built SQLite store (tests may change it)."""
    return Path(shutil.copytree(built, tmp_path / "s"))


@pytest.fixture(scope="module")
def built_any(
    tmp_path_factory: pytest.TempPathFactory, module_backend: str, init_options: Callable[..., dict[str, Any]]
) -> Path:
    """The built store on each backend."""
    return _build(tmp_path_factory.mktemp("fhir"), **init_options(module_backend))


@pytest.fixture()
def store_copy(built_any: Path, tmp_path: Path) -> Path:
    """A private copy of the built store of each backend (tests may change it)."""
    return copy_store(built_any, tmp_path / "s")


@pytest.fixture()
def exported(store_copy: Path, tmp_path: Path) -> Iterator[tuple[Path, list[dict[str, Any]], Store]]:
    """The export of the copied store, its parsed lines, and the open store."""
    store = open_store(store_copy)
    out = tmp_path / "audit.ndjson"
    count = export_fhir(store, out)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert count == len(lines)
    try:
        yield out, lines, store
    finally:
        store.close()


def _payload(resource: dict[str, Any]) -> dict[str, Any]:
    """The stored audit payload carried by a resource's chain extension."""
    (ext,) = [e for e in resource["extension"] if e["url"] == CHAIN_EXTENSION]
    parts = {p["url"]: p for p in ext["extension"]}
    decoded: dict[str, Any] = json.loads(base64.b64decode(parts["payload"]["valueBase64Binary"]))
    return decoded


# the export as a whole ----------------------------------------------------------------------


def test_every_line_is_a_valid_r5_auditevent(exported: tuple[Path, list[dict[str, Any]], Store]) -> None:
    """Each exported line parses as an R5 AuditEvent; one per stored event, ids audit-<seq> in order."""
    out, lines, store = exported
    for raw in out.read_text(encoding="utf-8").splitlines():
        FhirAuditEvent.model_validate_json(raw)
    seqs = [row.seq for row in store.iter_audit()]
    assert [r["id"] for r in lines] == [f"audit-{s}" for s in seqs]
    assert len(seqs) > 15  # grants, consents, writes, consolidations, reads and the deny


def test_chain_fields_match_the_store_and_reverify(exported: tuple[Path, list[dict[str, Any]], Store]) -> None:
    """seq, prevHash, eventHash and payload come from the stored rows; the export re-verifies alone."""
    out, lines, store = exported
    for resource, row in zip(lines, store.iter_audit(), strict=True):
        (ext,) = resource["extension"]
        parts = {p["url"]: p for p in ext["extension"]}
        assert parts["seq"]["valueInteger64"] == str(row.seq)
        assert parts["eventHash"]["valueString"] == row.event_hash
        assert base64.b64decode(parts["payload"]["valueBase64Binary"]) == bytes(row.payload)
        assert parts["prevHash"]["valueString"] == _payload(resource)["prev_hash"]
    result = verify_fhir(out)
    assert result.ok and result.count == len(lines)
    assert result.head_hash == store.audit_head()[1]


def test_no_patient_identifier_anywhere_in_the_export(exported: tuple[Path, list[dict[str, Any]], Store]) -> None:
    """The patient id appears nowhere (not even inside the payloads); the pseudonym stands in for it."""
    out, lines, _ = exported
    raw = out.read_bytes()
    assert PATIENT.encode() not in raw
    assert all(PATIENT not in json.dumps(_payload(r)) for r in lines)
    patients = {r["patient"]["identifier"]["value"] for r in lines if "patient" in r}
    assert len(patients) == 1 and next(iter(patients)).startswith("pt-")
    assert {r["patient"]["identifier"]["system"] for r in lines if "patient" in r} == {"urn:msm-mem:pseudonym"}


def test_patient_read_follows_the_balp_pattern(exported: tuple[Path, list[dict[str, Any]], Store]) -> None:
    """A read: DCM 110110, rest read, action R, pseudonymous patient, one entity per record id, the actor."""
    _, lines, _ = exported
    reads = [r for r in lines if r["code"]["text"] == "read"]
    assert reads
    for r in reads:
        stored = _payload(r)
        assert codes(r["category"][0]) == {DCM: "110110"}
        assert codes(r["code"])["http://hl7.org/fhir/restful-interaction"] == "read"
        assert r["action"] == "R"
        assert r["outcome"]["code"] == {"system": OUTCOME_SYSTEM, "code": "0", "display": "Success"}
        assert r["recorded"].endswith("Z") and r["recorded"].startswith("2023-11-14T22:13:20")
        assert r["patient"]["identifier"]["value"] == stored["patient"]
        records = [
            e["what"]["identifier"]["value"]
            for e in r["entity"]
            if e["what"]["identifier"]["system"] == "urn:msm-mem:record"
        ]
        assert records == stored["record_ids"] and records
        (agent,) = r["agent"]
        assert agent["requestor"] is True and agent["who"]["identifier"]["value"] == stored["actor"]
        assert r["source"]["observer"]["display"] == "msm-mem"
        assert codes(r["authorization"][0])["http://terminology.hl7.org/CodeSystem/v3-ActReason"] == "TREAT"


def test_consent_deny_is_a_serious_failure_with_the_reason(
    exported: tuple[Path, list[dict[str, Any]], Store],
) -> None:
    """The refused research access: AuthZconsent shape, outcome 8, the reason, the deny consent, HRESCH."""
    _, lines, _ = exported
    denied = lines[-1]
    assert denied["code"]["text"] == "consent"
    assert codes(denied["category"][0]) == {DCM: "110113"}
    assert codes(denied["code"])["https://profiles.ihe.net/ITI/BALP/CodeSystem/AuthZsubType"] == "AuthZ-Consent"
    assert denied["action"] == "E"
    assert denied["outcome"]["code"]["code"] == "8"
    (detail,) = denied["outcome"]["detail"]
    assert detail["text"] == "denied by consent" and codes(detail) == {"urn:msm-mem:audit-outcome": "denied"}
    assert denied["severity"] == "warning"
    consents = [e["what"]["identifier"]["value"] for e in denied["entity"] if e["what"].get("type") == "Consent"]
    assert consents == ["C-deny-research"]
    assert codes(denied["authorization"][0])["http://terminology.hl7.org/CodeSystem/v3-ActReason"] == "HRESCH"
    permits = [r for r in lines if r["code"]["text"] == "consent" and r["outcome"]["code"]["code"] == "0"]
    assert permits and all("detail" not in r["outcome"] for r in permits)


# verification of an export ----------------------------------------------------------------------


def _rewrite(path: Path, index: int, change: Any) -> None:
    """Apply ``change`` to the parsed line ``index`` of an export (None deletes it)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    new = change(json.loads(lines[index]))
    if new is None:
        del lines[index]
    else:
        lines[index] = json.dumps(new)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _set_outcome(r: dict[str, Any]) -> dict[str, Any]:
    r["outcome"]["code"]["code"] = "8"
    return r


def _swap_payload(r: dict[str, Any]) -> dict[str, Any]:
    payload = _payload(r)
    payload["actor"] = "someone-else"
    encoded = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    for p in r["extension"][0]["extension"]:
        if p["url"] == "payload":
            p["valueBase64Binary"] = base64.b64encode(encoded).decode()
    return r


@pytest.mark.parametrize(
    "change",
    [_set_outcome, _swap_payload, lambda r: None, lambda r: "not a resource"],
    ids=["edited-field", "changed-payload", "dropped-line", "foreign-line"],
)
def test_verify_names_the_first_tampered_line(exported: tuple[Path, list[dict[str, Any]], Store], change: Any) -> None:
    """An edited field, a changed payload, a dropped line or a foreign line fails at that seq."""
    out, _, _ = exported
    _rewrite(out, 6, change)
    result = verify_fhir(out)
    assert not result.ok and result.first_bad_seq == 7 and result.count == 6


def _zero_seq(r: dict[str, Any]) -> dict[str, Any]:
    r["extension"][0]["extension"][0]["valueInteger64"] = "0"
    return r


@pytest.mark.parametrize(
    "change", [lambda r: "{", lambda r: {}, _zero_seq], ids=["json-string", "empty-object", "seq-0"]
)
def test_verify_reports_a_bad_first_line(exported: tuple[Path, list[dict[str, Any]], Store], change: Any) -> None:
    """A malformed or impossible first line gives a failed result, not an exception."""
    out, _, _ = exported
    _rewrite(out, 0, change)
    result = verify_fhir(out)
    assert not result.ok and result.count == 0 and "line 1" in result.reason


def test_verify_after_purge_starts_at_the_base(store_copy: Path, tmp_path: Path) -> None:
    """A purged store exports from base+1; the export verifies from its first line, not from genesis."""
    with open_store(store_copy) as store:
        store.audit_purge(3)
        assert export_fhir(store, tmp_path / "p.ndjson") == sum(1 for _ in store.iter_audit()) > 0
    assert json.loads((tmp_path / "p.ndjson").read_text().splitlines()[0])["id"] == "audit-4"
    assert verify_fhir(tmp_path / "p.ndjson").ok
    assert not verify_fhir(tmp_path / "p.ndjson", start_seq=1, start_prev=GENESIS).ok


# writing the file --------------------------------------------------------------------------------


def test_empty_chain_exports_an_empty_file(store: Store, tmp_path: Path) -> None:
    """A store without audit events gives an empty file, 0 resources, and an ok verification."""
    with store:
        assert export_fhir(store, tmp_path / "e.ndjson") == 0
    assert (tmp_path / "e.ndjson").read_bytes() == b""
    assert verify_fhir(tmp_path / "e.ndjson").ok


def test_refuses_to_overwrite(exported: tuple[Path, list[dict[str, Any]], Store]) -> None:
    """An existing file is never overwritten (InvalidInput), and no temporary file is left."""
    out, _, store = exported
    out.write_bytes(b"keep me")
    with pytest.raises(InvalidInput, match="exists"):
        export_fhir(store, out)
    assert out.read_bytes() == b"keep me"
    assert sorted(os.listdir(out.parent)) == sorted([out.name, "s"])


def _tamper(store_dir: Path, seq: int, how: str = "edit") -> None:
    """Edit, delete or re-link (a valid hash over a wrong prev_hash) audit event ``seq`` in the database
    (either backend)."""
    with raw_db(store_dir) as conn:
        if how == "delete":
            conn.execute("DELETE FROM audit WHERE seq = ?", (seq,))
        else:
            (payload,) = conn.execute("SELECT payload FROM audit WHERE seq = ?", (seq,)).fetchone()
            event = AuditEvent.from_row(
                seq, payload, conn.execute("SELECT event_hash FROM audit WHERE seq = ?", (seq,)).fetchone()[0]
            )
            if how == "relink":
                forged = (
                    ChainBuilder(seq - 1, "f" * 64)
                    .next(
                        **{
                            k: getattr(event, k)
                            for k in (
                                "time actor role action source_tier target_tier purpose outcome"
                                " record_ids patient consent_id reason"
                            ).split()
                        }
                    )
                    .row()
                )
                conn.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (forged[1], forged[2], seq))
            else:
                edited = bytes(payload).replace(b'"outcome":"success"', b'"outcome":"denied"', 1)
                assert edited != bytes(payload)
                conn.execute("UPDATE audit SET payload = ? WHERE seq = ?", (edited, seq))


@pytest.mark.parametrize("how", ["edit", "delete", "relink"])
def test_broken_chain_is_not_exported(store_copy: Path, tmp_path: Path, how: str) -> None:
    """An edited, deleted or re-linked event stops the export with AuditChainBroken naming its seq; no file."""
    _tamper(store_copy, 5, how)
    out = tmp_path / "x.ndjson"
    with open_store(store_copy) as store:
        with pytest.raises(AuditChainBroken) as caught:
            export_fhir(store, out)
        assert caught.value.seq == 5
        with pytest.raises(AuditChainBroken):
            list(iter_fhir(store))
    assert sorted(os.listdir(tmp_path)) == ["s"]


# the command line -----------------------------------------------------------------------------


def test_cli_audit_export(store_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`msm-mem audit export DIR --fhir OUT` writes a valid export and says how many resources."""
    out = tmp_path / "cli.ndjson"
    assert main(["audit", "export", str(store_dir), "--fhir", str(out), *AUDITOR_FLAGS]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert f"exported {len(lines)} AuditEvent resources" in capsys.readouterr().out
    for raw in lines:
        FhirAuditEvent.model_validate_json(raw)
    assert verify_fhir(out).ok
    assert main(["audit", "export", str(store_dir), "--fhir", str(out), *AUDITOR_FLAGS]) == 1  # refuses to overwrite
    assert "already exists" in capsys.readouterr().err


def test_cli_refuses_a_broken_chain(store_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI verifies first: a tampered chain exits 1 with a refusal and writes nothing."""
    _tamper(store_dir, 8)
    out = tmp_path / "cli.ndjson"
    assert main(["audit", "export", str(store_dir), "--fhir", str(out), *AUDITOR_FLAGS]) == 1
    assert "refusing to export a broken chain" in capsys.readouterr().err
    assert not out.exists()
