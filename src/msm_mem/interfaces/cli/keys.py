"""Key commands: rotate the key-encryption key, shred a patient's data key (admin only), and the
API keys of the service."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ... import Purpose, Role
from .output import print_json
from .registry import command, group, open_mem, principal

__all__ = ["cmd_api_key", "cmd_rotate", "cmd_shred"]

group(
    "keys",
    """Keys: rotate the key-encryption key, shred a patient's data key (erasure), API keys.

    Rotation and shredding are the admin's and are audited with their reason; any other role is
    refused, and the refusal is audited too. API keys are the bearer credentials of the service.""",
)


def _configure_rotate(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--reason", default="scheduled rotation", help="why (recorded in the audit tier)")


@command("keys rotate", _configure_rotate, role=Role.ADMIN, credential=True)
def cmd_rotate(args: argparse.Namespace) -> int:
    """Make a new key-encryption key and rewrap every data key under it."""
    with open_mem(args) as mem:
        count = mem.rotate_keys(principal(args), args.reason)
    print(f"rotated: {count} data keys rewrapped")
    return 0


def _configure_shred(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    p.add_argument("--reason", required=True, help="why (recorded in the audit tier)")
    p.add_argument("--receipt", type=Path, help="write the signed erasure receipt (JSON) to this file")


@command("keys shred", _configure_shred, role=Role.ADMIN, purpose=Purpose.ERASURE, credential=True)
def cmd_shred(args: argparse.Namespace) -> int:
    """Erase one patient: every row of theirs destroyed (records, vectors, claims, short-term
    items, consent records), the data key destroyed, derived copies in other patients' memory
    retracted. The audit chain still verifies; `audit verify --receipt` checks the receipt."""
    with open_mem(args) as mem:
        receipt = mem.shred(principal(args), args.patient, args.reason)
    tables = ", ".join(f"{table} {n}" for table, n in receipt.counts if n)
    print(f"shredded patient: {receipt.records} records retracted and erased ({tables or 'none'}),", end=" ")
    print(f"{receipt.derived} derived copies retracted, data key destroyed; audit event seq {receipt.seq}")
    if args.receipt is not None:
        args.receipt.write_text(receipt.to_json() + "\n", encoding="utf-8")
    return 0


def _configure_api_key(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="key_action", required=True, metavar="ACTION")
    create = sub.add_parser(
        "create",
        help="make a key for one principal and patient scope; prints it once",
        description="Make an API key acting as one principal (--actor, --role, --purpose) over a patient scope"
        " (--patients). The key is printed once, on stdout; only its argon2 hash is kept.",
    )
    create.add_argument("dir", type=Path)
    create.add_argument("--actor", dest="key_actor", required=True, metavar="ID", help="the principal's id")
    create.add_argument("--role", dest="key_role", required=True, metavar="ROLE", help=", ".join(r.value for r in Role))
    create.add_argument(
        "--purpose", dest="key_purpose", metavar="PURPOSE", help="default: the role's usual purpose of use"
    )
    create.add_argument(
        "--patients", default="", metavar="P1,P2|*", help="the patients it may reach (* for all; default none)"
    )
    create.add_argument("--note", default="", help="what the key is for (shown by list)")
    listing = sub.add_parser(
        "list",
        help="every key with its principal, scope and times (never a secret)",
        description="Print every API key of DIR as one JSON object a line: its id, principal, patient scope,"
        " note and times (created, revoked); never a secret.",
    )
    listing.add_argument("dir", type=Path)
    revoke = sub.add_parser(
        "revoke",
        help="revoke a key from now on",
        description="Revoke the API key KEY_ID (from `list`): from now on the service refuses it, and a stdio"
        " MCP session using it ends at its next call. The record stays, marked revoked.",
    )
    revoke.add_argument("dir", type=Path)
    revoke.add_argument("key_id")


@command("keys api-key", _configure_api_key, role=None)
def cmd_api_key(args: argparse.Namespace) -> int:
    """API keys of `msm-mem serve`: create (printed once), list, revoke.

    A key acts as one principal (actor, role, purpose) over a patient scope (--patients P1,P2,
    or * for every patient; by default none: an admin then acts on a patient only with a
    break-glass reason). Only an argon2 hash of it is stored, in api-keys.json (mode 0600)
    in the store's key home folder, outside DIR. create and revoke need the admin credential
    (MSM_MEM_ADMIN_KEY or the key home's admin.key, see msm-mem --help); list shows no secret."""
    from ... import Principal
    from ..auth.apikeys import ApiKeyStore, parse_patients
    from .credential import require_admin_credential
    from .identity import USUAL_PURPOSE

    if args.key_action != "list":
        require_admin_credential(args.dir, f"keys api-key {args.key_action}")
    keys = ApiKeyStore.of_store(args.dir)
    if args.key_action == "create":
        who = Principal(args.key_actor, args.key_role)
        who = who.acting_for(args.key_purpose or USUAL_PURPOSE[who.role])
        token, record = keys.create(who, parse_patients(args.patients), note=args.note)
        print(token)
        print(f"key {record.key_id}: {who.id} as {who.role.value} for {who.purpose.value}", file=sys.stderr)
        return 0
    if args.key_action == "list":
        for k in keys.list():
            print_json(k.public())
        return 0
    record = keys.revoke(args.key_id)
    print(f"revoked key {record.key_id}")
    return 0
