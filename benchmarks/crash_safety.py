"""Crash safety at scale: a child process writing through the public API is killed with SIGKILL
at random points, and after each kill the parent opens the store and checks it.

The child (forked from the parent, so it starts in milliseconds instead of importing the
package again) opens the store and runs a random mix of ingest, ask with write-back, observe,
consolidate, feedback, consent grants and revocations, shredding, key rotation and a close and
reopen (which saves the FAISS cache). Before each call it writes what it is about to do to a
pipe, and after the call returned (the write is acknowledged) what it wrote (ids, counts), one
JSON line each, before it moves on. The parent kills it after a random delay (from the fork, so
a kill can land in opening too), then:

1. opens the store (``open``);
2. settles the one call in flight, which must be all there or not there at all (``in-flight``);
3. finds every acknowledged write exactly once: episodes and visuals by study, claims, STM
   items, consents and revocations (``acknowledged``), and nothing no call of a child made
   (``nothing-else``); shredded patients unreadable and their keys destroyed (``shredded``);
4. vectors, records and the FAISS cache agree: vectors per kind equal the rows, each position
   names its row, search finds every acknowledged episode, every STM item holds content
   exactly while it is active (``vectors``, ``search``, ``stm``); no key material left in
   temporary files (``keys``);
5. ``verify_audit`` is ok: the chain and the signed checkpoints (``audit``; hashes and links
   after each kill, every event re-canonicalised at each sweep of all patients);

and the next child continues on the same store, so damage would accumulate. ``run`` is what
``tests/test_crash_safety.py`` calls with a small sample.

Usage: python benchmarks/crash_safety.py [--kills 1000] [--postgres-kills 200] [--seed 0]
       [--minutes 25]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _crash_checks import CheckFailed, check, settle
from _crash_child import ADMIN, AUDITOR, Model, Pipe, apply, child_main

from msm_mem import MsmMem, MsmMemError

__all__ = ["AUDITOR", "Result", "run", "table"]

#: a check sweeps every patient every this many kills (otherwise those the last child touched)
FULL_SWEEP_EVERY = 25


@dataclass
class Result:
    backend: str
    kills: int = 0
    acknowledged: int = 0
    in_flight_committed: int = 0
    in_flight_absent: int = 0
    checks: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)


# the loop: fork, kill, check ----------------------------------------------------------------


@dataclass
class _Child:
    lines: list[dict[str, Any]]
    ready_s: float | None  # seconds from the fork to the opened store
    killed_at_s: float


def _fork_and_kill(directory: Path, model: Model, child_no: int, seed: int, delay_s: float) -> _Child:
    """Fork a child writing to the store; SIGKILL it ``delay_s`` after the fork; its reports."""
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller (the test runner, the script)
        code = 0
        try:
            os.close(read_fd)
            child_main(directory, model, child_no, seed, write_fd)
        except BaseException:
            code = 1
            with _suppress():
                Pipe(write_fd).send("crash", "", error=traceback.format_exc()[-2000:])
        os._exit(code)
    os.close(write_fd)
    buf, ready = b"", None
    try:
        deadline = start + delay_s
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([read_fd], [], [], left)
            if readable:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    break
                if ready is None and b'"ready"' in buf + chunk:
                    ready = time.monotonic() - start
                buf += chunk
        killed = time.monotonic() - start
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        while chunk := os.read(read_fd, 65536):
            buf += chunk
    finally:
        os.close(read_fd)
        with _suppress():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    # a line the kill cut short was never acknowledged
    lines = [json.loads(line) for line in buf.split(b"\n") if line.endswith(b"}")]
    return _Child(lines, ready, killed)


@contextmanager
def _suppress() -> Iterator[None]:
    try:
        yield
    except Exception:  # best effort: the child is dying or dead already
        pass


def _new_store(root: Path, backend: str, dsn: str | None) -> Path:
    directory = root / f"store-{backend}"
    (root / "images").mkdir(exist_ok=True)
    options: dict[str, Any] = {}
    if backend == "postgres":
        options = {"database_url": dsn, "schema": f"crash_{uuid.uuid4().hex[:12]}"}
    MsmMem.init(directory, ADMIN, **options).close()
    return directory


def run(
    root: Path,
    backend: str,
    kills: int,
    *,
    seed: int = 0,
    dsn: str | None = None,
    max_seconds: float = 1e9,
    log: Callable[[str], None] | None = None,
) -> Result:
    """Kill ``kills`` children writing one new store of ``backend`` (``sqlite``, or ``postgres``
    on the server ``dsn``) under ``root``, checking the store after each; stops early after
    ``max_seconds`` or at the first failure of a check (the store is damaged from then on)."""
    import faiss

    faiss.omp_set_num_threads(1)  # no OpenMP pool in the parent: a forked child may search safely
    rng = random.Random(seed)
    directory = _new_store(root, backend, dsn)
    model, result = Model(), Result(backend)
    began = time.monotonic()
    open_s, op_s = 0.3, 0.3  # running estimates that set the kill delays
    for k in range(kills):
        if time.monotonic() - began > max_seconds:
            break
        # uniform over opening and the first few calls: some kills land in opening
        delay = rng.uniform(0.0, open_s + 4 * op_s)
        child = _fork_and_kill(directory, model, k, rng.randrange(2**31), delay)
        result.kills += 1
        failure = _after_kill(directory, model, result, child, full=(k + 1) % FULL_SWEEP_EVERY == 0 or k + 1 == kills)
        if child.ready_s is not None:
            open_s = 0.8 * open_s + 0.2 * child.ready_s
            acks = sum(1 for line in child.lines if line["k"] == "ack")
            if acks:
                op_s = 0.8 * op_s + 0.2 * max(child.killed_at_s - child.ready_s, 0.01) / acks
        if log is not None and (failure or (k + 1) % 50 == 0):
            log(f"{backend}: {k + 1} kills, {result.acknowledged} acknowledged, {len(result.failures)} failures")
        if failure:
            break
    result.seconds = time.monotonic() - began
    return result


def _after_kill(directory: Path, model: Model, result: Result, child: _Child, *, full: bool) -> bool:
    """Take in the child's reports, open the store and check it; whether a check failed."""
    touched: set[str] = set()
    in_flight: tuple[str, dict[str, Any]] | None = None
    for report in child.lines:
        line = {k: v for k, v in report.items() if k not in ("k", "op")}
        kind, op = report["k"], report["op"]
        if kind == "start":
            in_flight = (op, line)
            model.planned.update(line.get("studies", []))
            if "study" in line:
                model.planned.add(line["study"])
            if "patient" in line:
                touched.add(line["patient"])
        elif kind == "ack" and in_flight is not None:
            op, plan = in_flight
            apply(model, op, plan, line)
            result.acknowledged += 1
            result.ops[op] = result.ops.get(op, 0) + 1
            in_flight = None
        elif kind == "error" and in_flight is not None:
            result.failures.append(f"kill {result.kills}: api: {in_flight[0]} failed: {line['error']}")
            in_flight = None
        elif kind == "crash":
            result.failures.append(f"kill {result.kills}: child: {line['error']}")
            return True
    try:
        try:
            mem = MsmMem.open(directory)
        except Exception as exc:
            raise CheckFailed("open", f"{type(exc).__name__}: {exc}") from exc
        try:
            if in_flight is not None:
                done = settle(mem, model, *in_flight)
                if done:
                    result.in_flight_committed += 1
                else:
                    result.in_flight_absent += 1
            patients = sorted(set(model.patients) | model.shredded) if full else sorted(touched)
            check(mem, model, patients, full=full)
            result.checks += 1
        finally:
            mem.close()
    except CheckFailed as exc:
        result.failures.append(f"kill {result.kills}: {exc}")
        return True
    except MsmMemError as exc:
        result.failures.append(f"kill {result.kills}: check raised {type(exc).__name__}: {exc}")
        return True
    return bool(result.failures)


# the script -----------------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    """The result table (Markdown)."""
    lines = [
        "| store | kills | operations acknowledged | in flight: committed / absent | checks passed | failures |"
        " seconds |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        first = r.failures[0] if r.failures else "none"
        lines.append(
            f"| {r.backend} | {r.kills} | {r.acknowledged} | {r.in_flight_committed} / {r.in_flight_absent} |"
            f" {r.checks} | {len(r.failures)}: {first} | {r.seconds:.0f} |"
        )
    ops: dict[str, int] = {}
    for r in results:
        for op, n in r.ops.items():
            ops[op] = ops.get(op, 0) + n
    lines.append("")
    lines.append("acknowledged by operation: " + ", ".join(f"{op} {n}" for op, n in sorted(ops.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="kills on the embedded store")
    parser.add_argument("--postgres-kills", type=int, default=200, help="kills on a PostgreSQL store (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=25.0, help="stop each backend's run after this share")
    args = parser.parse_args(argv)
    results: list[Result] = []
    total = args.kills + args.postgres_kills
    with tempfile.TemporaryDirectory(prefix="msm-mem-crash-") as tmp:
        root = Path(tmp)
        if args.kills:
            budget = args.minutes * 60 * args.kills / total
            results.append(run(root, "sqlite", args.kills, seed=args.seed, max_seconds=budget, log=print))
        if args.postgres_kills:
            from msm_mem.testing import local_server

            dsn = local_server(root / "pg", delete_at_exit=True)
            budget = args.minutes * 60 * args.postgres_kills / total
            results.append(
                run(root, "postgres", args.postgres_kills, seed=args.seed, dsn=dsn, max_seconds=budget, log=print)
            )
        shutil.rmtree(root / "images", ignore_errors=True)
    print(table(results))
    for r in results:
        for failure in r.failures[:5]:
            print(f"{r.backend}: {failure}", file=sys.stderr)
    return 0 if not any(r.failures for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
