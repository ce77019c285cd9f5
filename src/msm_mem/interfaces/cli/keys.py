"""Key commands: rotate the key-encryption key, shred a patient's data key (admin only)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import Purpose, Role
from .registry import command, group, open_mem, principal

__all__ = ["cmd_rotate", "cmd_shred"]

group(
    "keys",
    """Keys: rotate the key-encryption key, or shred a patient's data key (erasure).

    Both are the admin's and are audited with their reason; any other role is refused, and the
    refusal is audited too.""",
)


def _configure_rotate(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--reason", default="scheduled rotation", help="why (recorded in the audit tier)")


@command("keys rotate", _configure_rotate, role=Role.ADMIN)
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


@command("keys shred", _configure_shred, role=Role.ADMIN, purpose=Purpose.ERASURE)
def cmd_shred(args: argparse.Namespace) -> int:
    """Crypto-shred one patient: every record retracted, STM purged, the data key destroyed.

    Their data becomes unreadable for good; the audit chain still verifies."""
    with open_mem(args) as mem:
        count = mem.shred(principal(args), args.patient, args.reason)
    print(f"shredded patient: {count} records retracted, data key destroyed")
    return 0
