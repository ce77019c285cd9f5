"""More msm-mem commands: the demo (further groups register here as they land)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .cli import command

__all__ = ["cmd_demo"]


@command("demo", lambda p: (p.add_argument("out", type=Path, help="folder for the demo's data and store"),
                            p.add_argument("--seed", type=int, default=0)))
def cmd_demo(args: argparse.Namespace) -> int:
    """Run the main job end to end on the synthetic set: ingest, ask with write-back, evidence."""
    from .demo import run_demo

    return run_demo(args.out, seed=args.seed)
