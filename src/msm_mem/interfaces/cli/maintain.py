"""The maintenance command (the system role's sweeps)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import Role
from .output import print_json
from .registry import command, open_mem, principal

__all__ = ["cmd_maintain"]


@command("maintain", lambda p: p.add_argument("dir", type=Path), role=Role.SYSTEM)
def cmd_maintain(args: argparse.Namespace) -> int:
    """Maintenance: expire STM, consolidate aged STM, decay LTM, checkpoint the audit chain.

    Short-term items past their TTL are forgotten; held items older than the consolidation
    age go through the gate once more; long-term records past decay_at are anonymised in place
    (identifiers removed, content scrubbed); then the audit head is signed. Runs as the
    system role. Prints a JSON summary: expired, consolidated, discarded, anonymized,
    retracted, checkpoint [size, head]."""
    with open_mem(args) as mem:
        report = mem.maintain(principal(args))
    print_json(
        {
            "expired": report.expired,
            "consolidated": report.consolidated,
            "discarded": report.discarded,
            "anonymized": report.anonymized,
            "retracted": report.retracted,
            "checkpoint": list(report.checkpoint or ()),
        }
    )
    return 0
