"""Audit commands: verify the chain, sign a checkpoint, export FHIR AuditEvents."""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import AuditChainBroken, ErasureReceipt, Purpose, Role, VerifyResult
from .output import print_json
from .registry import command, group, open_mem, principal

__all__ = ["cmd_checkpoint", "cmd_export", "cmd_verify"]

group(
    "audit",
    """Audit tier: verify the chain, sign a checkpoint, export FHIR AuditEvents.

    As an auditor or admin (checkpoint: also the system role). The audit tier holds ids and
    pseudonyms only, never patient data.""",
)


def _configure_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--hashes-only", action="store_true", help="check hashes and links without re-canonicalising")
    p.add_argument("--json", action="store_true", help="print one JSON object: ok, count, head, first_bad_seq, reason")
    p.add_argument(
        "--processes",
        type=_processes,
        help="worker processes for a full verification (default: one per core from 200,000 events on 3 cores; 1: none)",
    )
    p.add_argument("--receipt", type=Path, help="also check this erasure receipt (of `keys shred --receipt`)")


def _processes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


@command("audit verify", _configure_verify, role=Role.ADMIN, purpose=Purpose.AUDIT)
def cmd_verify(args: argparse.Namespace) -> int:
    """Verify the hash chain, the signed checkpoints and the governed rows (read-only).

    Exits 0 when the chain, its checkpoints and the rows they sign are intact and 3 when not,
    naming the first bad seq, or the table whose rows were changed outside msm-mem (a full
    verification recomputes the row digests; --hashes-only leaves them out). With --receipt,
    also the erasure receipt: its signature, its event in the chain, the rows it names empty.
    A store that cannot be opened because it is not what its key home recorded (its schema set
    back, another store's record) is broken too: 3, naming what differs."""
    receipt = None if args.receipt is None else ErasureReceipt.from_json(args.receipt.read_bytes())
    try:
        with open_mem(args) as mem:
            result = mem.verify_audit(
                principal(args), full=not args.hashes_only, processes=args.processes, receipt=receipt
            )
    except AuditChainBroken as exc:
        result = VerifyResult(False, 0, "", exc.seq, str(exc))
    if args.json:
        print_json(
            {
                "ok": result.ok,
                "count": result.count,
                "head": result.head_hash,
                "first_bad_seq": result.first_bad_seq,
                "reason": result.reason,
            }
        )
    elif result.ok:
        print(f"audit chain intact: {result.count} events, head {result.head_hash}")
    else:
        where = f"first bad seq {result.first_bad_seq}: " if result.first_bad_seq else ""
        print(f"audit chain BROKEN: {where}{result.reason}")
    return 0 if result.ok else 3


@command("audit checkpoint", lambda p: p.add_argument("dir", type=Path), role=Role.ADMIN, purpose=Purpose.AUDIT)
def cmd_checkpoint(args: argparse.Namespace) -> int:
    """Sign the current head of the chain (appended to DIR/audit/checkpoints.jsonl)."""
    with open_mem(args) as mem:
        size, head = mem.checkpoint(principal(args))
    print(f"checkpoint signed: size {size}, head {head}")
    return 0


def _configure_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--fhir", type=Path, required=True, metavar="OUT", help="output file (.ndjson)")


@command("audit export", _configure_export, role=Role.ADMIN, purpose=Purpose.AUDIT)
def cmd_export(args: argparse.Namespace) -> int:
    """Export every audit event as a FHIR R5 AuditEvent (IHE BALP), one JSON object a line.

    A broken chain is refused; the export itself is audited."""
    with open_mem(args) as mem:
        count = mem.export_fhir(principal(args), args.fhir)
    print(f"exported {count} AuditEvent resources to {args.fhir}")
    return 0
