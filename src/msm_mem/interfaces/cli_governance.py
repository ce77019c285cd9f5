"""Governance commands: audit, consent, keys, maintain (thin layers over MsmMem)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from .._api.mem import ADMIN, MsmMem
from .._errors import AuditChainBroken, InvalidInput
from .._memory.tiers import Actor
from .._records import new_id
from .._tier_records import ConsentRecord
from ..datasets.manifest import parse_timestamp
from .cli import command

__all__ = ["cmd_audit", "cmd_consent", "cmd_keys", "cmd_maintain"]


def _configure_audit(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    v = sub.add_parser("verify", help="verify the hash chain and the signed checkpoints")
    v.add_argument("dir", type=Path)
    v.add_argument("--hashes-only", action="store_true", help="check hashes and links without re-canonicalising")
    c = sub.add_parser("checkpoint", help="sign the current head of the chain")
    c.add_argument("dir", type=Path)
    e = sub.add_parser("export", help="export FHIR R5 AuditEvent resources (IHE BALP) as JSON lines")
    e.add_argument("dir", type=Path)
    e.add_argument("--fhir", type=Path, required=True, metavar="OUT", help="output file (.ndjson)")


@command("audit", _configure_audit)
def cmd_audit(args: argparse.Namespace) -> int:
    """Audit tier: verify the chain, sign a checkpoint, export FHIR AuditEvents.

    verify exits 0 when the chain and its checkpoints are intact and 3 when not, naming the
    first bad seq; export --fhir OUT writes FHIR R5 AuditEvent resources (IHE BALP), one JSON
    object a line."""
    with MsmMem.open(args.dir) as mem:
        if args.action == "verify":
            result = mem.audit.verify(full=not args.hashes_only)
            if not result.ok:
                where = f"first bad seq {result.first_bad_seq}" if result.first_bad_seq else "checkpoints"
                print(f"audit chain BROKEN: {where}: {result.reason}")
                return 3
            print(f"audit chain intact: {result.count} events, head {result.head_hash}")
            return 0
        if args.action == "checkpoint":
            size, head = mem.audit.checkpoint()
            print(f"checkpoint signed: size {size}, head {head}")
            return 0
        from .._governance.fhir import export_fhir

        result = mem.audit.verify()
        if not result.ok:
            raise AuditChainBroken(f"refusing to export a broken chain: {result.reason}", result.first_bad_seq)
        count = export_fhir(mem.store, args.fhir)
        print(f"exported {count} AuditEvent resources to {args.fhir}")
        return 0


def _time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_timestamp(text)
    except ValueError as exc:
        raise InvalidInput(f"bad time {text!r}: {exc}") from exc


def _configure_consent(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    g = sub.add_parser("grant", help="add a consent record (permit or deny)")
    g.add_argument("dir", type=Path)
    g.add_argument("--patient", required=True, help="patient id, or * for every patient")
    g.add_argument("--grantee", required=True, help="actor:<id> or role:<role>")
    g.add_argument("--purpose", required=True, help="purpose of use, e.g. treatment, research, export")
    g.add_argument(
        "--classes", default="*", help="comma-separated data classes (episodic,visual,semantic,stm,claims) or *"
    )
    g.add_argument("--deny", action="store_true", help="record a deny instead of a permit")
    g.add_argument("--start", help="ISO 8601 start (default now)")
    g.add_argument("--end", help="ISO 8601 end (default open)")
    r = sub.add_parser("revoke", help="revoke a consent record from now on")
    r.add_argument("dir", type=Path)
    r.add_argument("consent_id")
    ls = sub.add_parser("list", help="list consent records")
    ls.add_argument("dir", type=Path)
    ls.add_argument("--patient")


@command("consent", _configure_consent)
def cmd_consent(args: argparse.Namespace) -> int:
    """Consent records: grant, revoke, list. Every access is checked; no permit means denied."""
    with MsmMem.open(args.dir) as mem:
        if args.action == "grant":
            now = mem.clock.now()
            record = ConsentRecord(
                consent_id=new_id("C"),
                patient_id=args.patient,
                grantee=args.grantee,
                purpose=args.purpose,
                decision="deny" if args.deny else "permit",
                data_classes=tuple(c.strip() for c in args.classes.split(",") if c.strip()),
                start=_time(args.start) or now,
                end=_time(args.end),
                created_at=now,
            )
            mem.grant([record], ADMIN)
            print(record.consent_id)
        elif args.action == "revoke":
            mem.revoke(args.consent_id, ADMIN)
            print(f"revoked {args.consent_id}")
        else:
            for c in mem.store.consents(args.patient):
                end = datetime.fromtimestamp(c.end, UTC).isoformat() if c.end else "open"
                revoked = f" revoked {datetime.fromtimestamp(c.revoked_at, UTC).isoformat()}" if c.revoked_at else ""
                print(
                    f"{c.consent_id} {c.decision} patient={c.patient_id} grantee={c.grantee} purpose={c.purpose} "
                    f"classes={','.join(c.data_classes)} until={end}{revoked}"
                )
    return 0


def _configure_keys(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = sub.add_parser("rotate", help="new key-encryption key; rewrap every data key")
    r.add_argument("dir", type=Path)
    s = sub.add_parser("shred", help="crypto-shred one patient: their data becomes unreadable")
    s.add_argument("dir", type=Path)
    s.add_argument("--patient", required=True)
    s.add_argument("--reason", required=True, help="why (recorded in the audit tier)")


@command("keys", _configure_keys)
def cmd_keys(args: argparse.Namespace) -> int:
    """Keys: rotate the key-encryption key, or shred a patient's data key (erasure)."""
    with MsmMem.open(args.dir) as mem:
        if args.action == "rotate":
            count = mem.cipher.rotate_kek()
            spec = mem.audit.spec(
                actor=ADMIN.id,
                role=ADMIN.role,
                action="key_rotate",
                source_tier="ltm",
                target_tier="ltm",
                purpose="operations",
                reason=f"{count} data keys rewrapped",
            )
            from .._storage.base import WriteBatch

            mem.audit.write(WriteBatch(), [spec])
            print(f"rotated: {count} data keys rewrapped")
        else:
            count = mem.maintainer.shred(Actor(ADMIN.id, "admin"), args.patient, args.reason)
            print(f"shredded patient: {count} records retracted, data key destroyed")
    return 0


@command("maintain", lambda p: p.add_argument("dir", type=Path))
def cmd_maintain(args: argparse.Namespace) -> int:
    """Maintenance: expire STM, consolidate aged STM, decay LTM, checkpoint the audit chain.

    Short-term items past their TTL are forgotten; held items older than the consolidation
    age go through the gate once more; long-term records past decay_at are anonymised in place
    (identifiers removed, content scrubbed); then the audit head is signed. Prints a JSON
    summary."""
    with MsmMem.open(args.dir) as mem:
        report = mem.maintain()
    print(
        json.dumps(
            {
                "expired": report.expired,
                "consolidated": report.consolidated,
                "discarded": report.discarded,
                "anonymized": report.anonymized,
                "retracted": report.retracted,
                "checkpoint": list(report.checkpoint or ()),
            }
        )
    )
    return 0
