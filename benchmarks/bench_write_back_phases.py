"""Where a governed write-back turn spends its time: microseconds per turn in each phase.

Runs the write-back rows of ``bench_governance.py`` (same turns, same stores) with a timer
around each named phase and prints a Markdown table, one column per row. Phases nest (for
example ``store write`` holds ``store _apply``, which holds ``encrypt field``), so columns do
not add up; the turn total is measured without the timers' own cost only approximately
(each timer adds about 0.2 us); a phase's name is indented by one
dot for each phase that holds it. Use it to see which part a change should target, and
``bench_governance.py`` for the rates themselves.

Usage: python benchmarks/bench_write_back_phases.py [--interactions 20000] [--patients 1000 100]
"""

from __future__ import annotations

import argparse
import collections
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_governance import bench_write_back

from msm_mem._governance import audit, audit_chain, crypto
from msm_mem._memory import claims, msm, tiers
from msm_mem._storage import sql_write, sqlite

SPENT: collections.Counter[str] = collections.Counter()

#: (owner, attribute, depth, label): the phases timed, each after the phase that holds it
PHASES = [
    (tiers.GovernedMemory, "begin", 0, "begin (consent, pseudonym)"),
    (tiers.GovernedMemory, "observe", 0, "observe (STM write)"),
    (tiers.GovernedMemory, "consolidate", 0, "consolidate (gate, records, claim)"),
    (msm.Memory, "max_cosine", 1, "novelty check (max cosine over E and V)"),
    (tiers.GovernedMemory, "_claim", 1, "claim and derived entities"),
    (claims, "link_findings", 2, "labeler and entities"),
    (tiers.GovernedMemory, "commit_many", 0, "commit_many (audit rows + store write)"),
    (audit_chain.ChainBuilder, "next_row", 1, "audit row (canonicalise, hash)"),
    (sqlite.SqliteStore, "write", 1, "store write (rows, SQL, fsync)"),
    (sqlite.SqliteStore, "_apply", 2, "store _apply (rows and SQL before COMMIT)"),
    (sql_write.SqlWriter, "_insert_versions", 3, "claim and semantic versions"),
    (crypto.EnvelopeCipher, "encrypt_field", 3, "encrypt field (all fields)"),
    (sqlite.SqliteStore, "_committed", 2, "after commit (index, cache)"),
    (audit.AuditLog, "spec", 0, "audit event spec"),
]


def _timed(f: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - t0

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interactions", type=int, default=20_000)
    ap.add_argument("--patients", type=int, nargs="+", default=[1000, 100])
    args = ap.parse_args()
    if min(args.patients) < 100 or args.interactions < 100:
        ap.error("--patients and --interactions: at least 100")
    for owner, name, _, label in PHASES:
        setattr(owner, name, _timed(getattr(owner, name), label))
    runs = [(p, False) for p in args.patients] + [(args.patients[0], True)]
    columns = []
    with tempfile.TemporaryDirectory() as tmp:
        for patients, unique in runs:
            SPENT.clear()
            rate = bench_write_back(Path(tmp), args.interactions, patients, unique)
            per_turn = {label: SPENT[label] / args.interactions * 1e6 for _, _, _, label in PHASES}
            columns.append((patients, unique, rate, per_turn))
    heads = [f"{p:,} patients, {'unique' if u else '240 distinct'} impressions" for p, u, _, _ in columns]
    print("| us per turn | " + " | ".join(heads) + " |")
    print("|---" * (len(heads) + 1) + "|")
    print("| whole turn (1 / rate, with timers) | " + " | ".join(f"{1e6 / r:.0f}" for _, _, r, _ in columns) + " |")
    for _, _, depth, label in PHASES:
        cells = " | ".join(f"{c[label]:.1f}" for _, _, _, c in columns)
        print(f"| {'. ' * depth}{label} | {cells} |")


if __name__ == "__main__":
    main()
