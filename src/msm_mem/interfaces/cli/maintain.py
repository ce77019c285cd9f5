"""The maintenance command (the system role's sweeps)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import Role
from .output import print_json
from .registry import command, open_mem, principal

__all__ = ["cmd_maintain"]


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing; print what decay would anonymise or retract now, and why",
    )


@command("maintain", _args, role=Role.SYSTEM)
def cmd_maintain(args: argparse.Namespace) -> int:
    """Maintenance: expire STM, consolidate aged STM, decay LTM, checkpoint the audit chain.

    Short-term items past their TTL are forgotten; held items older than the consolidation
    age go through the gate once more; a long-term record is anonymised in place (identifiers
    removed, content scrubbed) once its patient's last activity in the store plus the retention
    (MSM_MEM_RETENTION_S, default ten years, x confidence x tier weight) has passed; then the
    audit head is signed. Runs as the system role. Prints a JSON summary: expired,
    consolidated, discarded, anonymized, retracted, checkpoint [size, head]. With --dry-run
    nothing is written (one audit read event): the summary counts what decay would do and
    "decay" lists each record: kind, id, state, confidence, evidence tier, the patient's last
    activity, its retention, the due time (UTC seconds) and what it would become."""
    with open_mem(args) as mem:
        report = mem.maintain(principal(args), dry_run=args.dry_run)
    out: dict[str, object] = {
        "expired": report.expired,
        "consolidated": report.consolidated,
        "discarded": report.discarded,
        "anonymized": report.anonymized,
        "retracted": report.retracted,
        "checkpoint": list(report.checkpoint or ()),
    }
    if args.dry_run:
        out["dry_run"] = True
        out["decay"] = [
            {
                "kind": d.kind,
                "id": d.record_id,
                "state": d.state.value,
                "confidence": d.confidence,
                "evidence_tier": d.evidence_tier,
                "last_activity": d.last_activity,
                "retention_s": d.retention_s,
                "due_at": d.due_at,
                "to": d.to.value,
            }
            for d in report.decay
        ]
    print_json(out)
    return 0
