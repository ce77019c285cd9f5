"""Consent commands: grant, revoke, list (admin; the auditor may list, under pseudonyms)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import ConsentRecord, Role
from ..._records import new_id
from .output import iso, parse_time, print_json
from .registry import command, group, open_mem, principal

__all__ = ["cmd_grant", "cmd_list", "cmd_revoke"]

group(
    "consent",
    """Consent records: grant, revoke, list. Every access is checked; no permit means denied.

    Granting and revoking are the admin's; listing is the admin's or the auditor's, who sees
    each patient as the pseudonym of the audit trail, never the patient id. All are audited.""",
)


def _configure_grant(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True, help="patient id, or * for every patient")
    p.add_argument("--grantee", required=True, help="actor:<id> or role:<role>")
    p.add_argument("--purpose", required=True, help="the consent's purpose of use, e.g. treatment, research, export")
    p.add_argument(
        "--classes",
        default="*",
        help="comma-separated data classes (episodic,visual,semantic,stm,claims,population) or *",
    )
    p.add_argument("--deny", action="store_true", help="record a deny instead of a permit")
    p.add_argument("--start", help="ISO 8601 start (default now)")
    p.add_argument("--end", help="ISO 8601 end (default open)")


@command("consent grant", _configure_grant, role=Role.ADMIN, purpose_flag=False, credential=True)
def cmd_grant(args: argparse.Namespace) -> int:
    """Add a consent record (permit or deny) and print its id.

    Here --purpose is the consent's purpose of use (what the grantee may act for); the audit
    event of the grant carries it. The granting admin is --actor/--role (or MSM_MEM_ACTOR,
    MSM_MEM_ROLE, or DIR/identity.json)."""
    with open_mem(args) as mem:
        now = mem.now()
        record = ConsentRecord(
            consent_id=new_id("C"),
            patient_id=args.patient,
            grantee=args.grantee,
            purpose=args.purpose,
            decision="deny" if args.deny else "permit",
            data_classes=tuple(c.strip() for c in args.classes.split(",") if c.strip()),
            start=parse_time(args.start) or now,
            end=parse_time(args.end),
            created_at=now,
        )
        mem.grant(principal(args), [record])
    print(record.consent_id)
    return 0


def _configure_revoke(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("consent_id")


@command("consent revoke", _configure_revoke, role=Role.ADMIN, credential=True)
def cmd_revoke(args: argparse.Namespace) -> int:
    """Revoke a consent record from now on (the record stays, marked revoked)."""
    with open_mem(args) as mem:
        mem.revoke(principal(args), args.consent_id)
    print(f"revoked {args.consent_id}")
    return 0


def _configure_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", help="one patient's records (default: all)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON list")


@command("consent list", _configure_list, role=Role.ADMIN)
def cmd_list(args: argparse.Namespace) -> int:
    """List consent records, one a line (the auditor sees pseudonyms instead of patient ids)."""
    with open_mem(args) as mem:
        records = mem.consents(principal(args), args.patient)
    if args.json:
        print_json(records)
        return 0
    for c in records:
        revoked = f" revoked {iso(c.revoked_at)}" if c.revoked_at else ""
        print(
            f"{c.consent_id} {c.decision} patient={c.patient_id} grantee={c.grantee} purpose={c.purpose} "
            f"classes={','.join(c.data_classes)} until={iso(c.end)}{revoked}"
        )
    return 0
