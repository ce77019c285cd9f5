"""Full and hash-only re-verification of a long audit chain, each in a fresh interpreter.

Makes (or reuses, with ``--workdir``) a store of ``--events`` audit events written as
``bench_governance.py`` writes them (1,000 per transaction, each commit signed), except that
the clock ticks 137 us per event, so every event has its own fractional time as a real store
has. Then times the public ``MsmMem.verify_audit`` in fresh interpreters, one verification
each, the modes interleaved round by round (``--repeat`` rounds; medians printed): full
verification in one process and with each ``--processes`` count of workers, and hash-only.
The events are appended with the audit log's own write (private: no public call appends audit
events alone, and a million public reads would take hours to make them).

Wall is the verification call's elapsed time. CPU is the CPU time of every process the call
used: its own, and with workers the forkserver's and its workers' (the server's start, which
imports the package, included). Prints a Markdown table and the load average before and after.

Usage: python benchmarks/bench_audit_verify.py [--events 1000000] [--workdir DIR]
       [--processes 2] [--repeat 3]
(``--events 2000 --repeat 1``: a run of seconds.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def make_store(directory: Path, events: int) -> None:
    """A new store in ``directory`` holding ``events`` audit events."""
    from bench_governance import ADMIN, append_events

    from msm_mem import FixedClock, MsmMem

    class TickingClock(FixedClock):
        def now(self) -> float:
            return self.advance(0.000137)

    with MsmMem.init(directory, ADMIN, clock=TickingClock(1.7e9)) as mem:
        append_events(mem, events - mem._store.audit_head()[0])  # (init audited a few events)


def _forkserver_cpu() -> float:
    """CPU seconds of this process's forkserver and the workers it forked and reaped (0 if none)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def child(directory: Path, mode: str, processes: int) -> None:
    """One verification in this fresh interpreter; prints one JSON line."""
    from msm_mem import MsmMem, Principal, Purpose, Role

    auditor = Principal("bench-auditor", Role.AUDITOR, Purpose.AUDIT)
    with MsmMem.open(directory) as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        result = mem.verify_audit(auditor, full=mode == "full", processes=processes or None)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"ok": result.ok, "count": result.count, "wall": wall, "cpu": cpu + _forkserver_cpu()}))


def made(directory: Path, events: int) -> Path:
    """``directory`` with ``events`` events, made in a fresh interpreter unless it exists."""
    if not directory.exists():
        subprocess.run([sys.executable, str(HERE), "--make", str(directory), str(events)], check=True)
    return directory


def run(directory: Path, mode: str, processes: int) -> dict[str, float]:
    """The figures of one verification in a fresh interpreter; exits when the chain fails."""
    command = [sys.executable, str(HERE), "--child", str(directory), mode, str(processes)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if not figures["ok"]:
        raise SystemExit(f"the chain did not verify: {out}")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--workdir", type=Path, help="keep the store here (made if missing) to reuse it")
    ap.add_argument("--processes", type=int, nargs="+", default=[2], help="worker counts to measure (besides 1)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--make", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        make_store(Path(args.make[0]), int(args.make[1]))
        return
    if args.child:
        child(Path(args.child[0]), args.child[1], int(args.child[2]))
        return
    if args.events < 1 or args.repeat < 1 or min(args.processes) < 2:
        ap.error("--events and --repeat: at least 1; --processes: counts of at least 2")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        store = made(work / f"audit-{args.events}", args.events)
        runs = [("full", 1), *[("full", p) for p in args.processes], ("hash", 0)]
        figures: dict[tuple[str, int], list[dict[str, float]]] = {r: [] for r in runs}
        load_before = os.getloadavg()
        for round_ in range(args.repeat):  # interleaved, the order turned every round
            for mode, processes in runs if round_ % 2 == 0 else runs[::-1]:
                figures[(mode, processes)].append(run(store, mode, processes))
        load_after = os.getloadavg()
    print(f"{args.events:,} events; {len(os.sched_getaffinity(0))} cores; medians of {args.repeat} runs")
    before, after = (f"{a[0]:.1f} / {a[1]:.1f}" for a in (load_before, load_after))
    print(f"load average (1 / 5 min) before {before}, after {after}")
    print("| verification | wall s | CPU s (all processes) | wall range |")
    print("|---|---|---|---|")
    for (mode, processes), found in figures.items():
        what = "hash-only" if mode == "hash" else "full"
        if mode == "full":
            what += ", one process" if processes == 1 else f", {processes} workers"
        walls = [f["wall"] for f in found]
        cpu = statistics.median(f["cpu"] for f in found)
        print(f"| {what} | {statistics.median(walls):.2f} | {cpu:.2f} | {min(walls):.2f}-{max(walls):.2f} |")


if __name__ == "__main__":
    main()
