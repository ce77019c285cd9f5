"""Measuring one source tree beside another: a worker process per run that imports msm-mem
from the tree asked for (``PYTHONPATH=TREE/src``) and prints one figure, checked to come from
that tree. Used by bench_write_back_stores.py and bench_ask_one.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["answer", "run_in_tree"]


def run_in_tree(tree: Path, script: str, args: list[str]) -> float:
    """Run ``script --worker ARGS`` with msm-mem imported from ``tree``; the figure it printed."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, script, "--worker", *args]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.split()
    if not Path(out[1]).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the worker imported msm_mem from {out[1]}, not from {tree}")
    return float(out[0])


def answer(figure: float) -> None:
    """The worker's one line: the figure and where msm-mem was imported from."""
    import msm_mem

    print(f"{figure} {msm_mem.__file__}")
