"""Measuring one source tree beside another: a worker process per run that imports msm-mem
from the tree asked for (``PYTHONPATH=TREE/src``) and prints one figure, checked to come from
that tree. Used by bench_write_back_stores.py, bench_ask_one.py and bench_patient_reads.py."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["answer", "run_in_tree", "table_head", "tree_arguments", "trees_of"]

THIS_TREE = Path(__file__).resolve().parent.parent


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


def tree_arguments(ap: argparse.ArgumentParser) -> None:
    """``--baseline OTHER_TREE`` and the hidden ``--worker`` (the measuring process's flag)."""
    ap.add_argument(
        "--baseline", type=Path, help="another source tree (holding src/msm_mem) to measure beside this one"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def trees_of(ap: argparse.ArgumentParser, baseline: Path | None) -> list[tuple[str, Path]]:
    """This tree, then the ``--baseline`` tree when one is given (an error unless it holds
    ``src/msm_mem``)."""
    trees = [("this tree", THIS_TREE)]
    if baseline is not None:
        if not (baseline / "src" / "msm_mem").is_dir():
            ap.error(f"--baseline: {baseline} holds no src/msm_mem")
        trees.append(("baseline", baseline.resolve()))
    return trees


def table_head(first: str, trees: list[tuple[str, Path]], cell: str) -> str:
    """The two head lines of a Markdown table: ``first``, a column per tree (its name, then
    ``cell``) and a ratio column when there are two trees."""
    names = " | ".join(f"{name}, {cell}" for name, _ in trees)
    ratio = " | ratio |" if len(trees) > 1 else " |"
    return f"| {first} | {names}{ratio}\n" + "|---" * (1 + len(trees) + (len(trees) > 1)) + "|"
