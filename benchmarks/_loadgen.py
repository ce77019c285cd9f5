"""The load side of bench_service.py: wrk (a standard HTTP load generator in C) driven by a Lua
script that POSTs the listed bodies in turn (an image upload as multipart, or a stored study's
reference as a urlencoded form), the bodies themselves, and the CPU time of the server's
processes (Linux ``/proc``).

The list interleaves the patients (every patient's first study, then every patient's second,
...): the connections in flight at once ask about different patients, as agents holding one
conversation per patient would; consecutive studies of one patient racing each other across
worker processes are a known conflict of write-back (``409``, docs/design.md), not load."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlencode

import httpx

__all__ = ["BOUNDARY", "LUA", "OPS", "context_switches", "cpu_seconds", "interleaved", "request_list", "warm_up", "wrk"]

QUESTION = "What is the impression?"
BOUNDARY = "msmbenchboundary7d1e"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"
FORM = "application/x-www-form-urlencoded"
#: the measured operations: name -> (endpoint, how the image is sent)
OPS = {"retrieve": ("retrieve", "upload"), "retrieve-study": ("retrieve", "study"), "ask": ("ask", "upload")}

#: the wrk script: every listed request in turn (each thread starts at a random one), and the
#: summary as one JSON line (latencies in microseconds from wrk, written in milliseconds;
#: ``refused``: answers with a status of 400 or more, counted in ``requests`` by wrk)
LUA = """
local reqs, idx = {}, 0
function init(args)
  for line in io.lines(os.getenv("BENCH_LIST")) do
    local path, file, kind = line:match("^(%S+) (%S+) (%S+)$")
    local f = io.open(file, "rb"); local body = f:read("*a"); f:close()
    local ctype = "multipart/form-data; boundary=" .. os.getenv("BENCH_BOUNDARY")
    if kind == "form" then ctype = "application/x-www-form-urlencoded" end
    reqs[#reqs + 1] = wrk.format("POST", path, {
      ["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN"),
      ["Content-Type"] = ctype,
    }, body)
  end
  idx = math.random(#reqs)
end
function request()
  idx = idx % #reqs + 1
  return reqs[idx]
end
function done(s, latency, requests)
  local e = s.errors
  io.write(string.format('BENCH {"requests": %d, "seconds": %f, "errors": %d, "refused": %d, "p50": %f, "p99": %f}\\n',
    s.requests, s.duration / 1e6, e.status + e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3))
end
"""


def interleaved(studies: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """``(patient, image, study_id)`` rows reordered: every patient's first study, then every
    patient's second, ... (patients in their first-seen order, studies in theirs)."""
    by_patient: dict[str, list[tuple[str, str, str]]] = {}
    for row in studies:
        by_patient.setdefault(row[0], []).append(row)
    rounds = max((len(rows) for rows in by_patient.values()), default=0)
    return [rows[i] for i in range(rounds) for rows in by_patient.values() if i < len(rows)]


def request_list(work: Path, studies: list[tuple[str, str, str]], op: str) -> Path:
    """One body file per study and the list wrk reads (``path file kind`` per line), in the
    order of :func:`interleaved`."""
    endpoint, image_by = OPS[op]
    folder = work / f"bodies-{op}"
    folder.mkdir(exist_ok=True)
    fields = {"question": QUESTION, "write_back": "true"} if endpoint == "ask" else {}
    lines = []
    for i, (patient, image, study_id) in enumerate(interleaved(studies)):
        body = folder / f"{i}.bin"
        if image_by == "study":
            body.write_bytes(urlencode({**fields, "image_study": study_id}).encode())
            lines.append(f"/v1/patients/{patient}/{endpoint} {body} form")
            continue
        parts = b"".join(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
            for k, v in fields.items()
        )
        parts += (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="q.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        body.write_bytes(parts + Path(image).read_bytes() + f"\r\n--{BOUNDARY}--\r\n".encode())
        lines.append(f"/v1/patients/{patient}/{endpoint} {body} multipart")
    listing = work / f"list-{op}.txt"
    listing.write_text("\n".join(lines) + "\n")
    return listing


def cpu_seconds(root: int) -> tuple[float, float]:
    """User + system CPU seconds of ``root`` and its child processes, live ones (Linux
    ``/proc``): all their threads, and their main threads alone (a server process's main thread
    runs its event loop: the HTTP side of a request, where the other threads do its work)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, main = 0.0, 0.0
    for pid, cpu in _tree(root, tick):
        total += cpu
        try:
            main += _parent_and_cpu(Path(f"/proc/{pid}/task/{pid}/stat"), tick)[1]
        except OSError:
            pass
    return total, main


_SWITCHES = ("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")


def context_switches(root: int) -> int:
    """Context switches so far (voluntary and not) of every live thread of ``root`` and its
    child processes (Linux ``/proc``): a thread that blocks (on the interpreter lock, a lock,
    a condition, I/O) counts one each time, and the scheduler's preemptions count too."""
    count = 0
    for pid, _ in _tree(root, os.sysconf("SC_CLK_TCK")):
        for task in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                lines = task.read_text().splitlines()
            except OSError:
                continue
            count += sum(int(line.split()[1]) for line in lines if line.startswith(_SWITCHES))
    return count


def _tree(root: int, tick: int) -> list[tuple[int, float]]:
    """``(pid, CPU seconds)`` of ``root`` and its live child processes."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = _parent_and_cpu(entry / "stat", tick)
            except OSError:
                continue
    tree, out = {root}, []
    for pid in sorted(stats):  # children have larger pids than their parents here
        if pid in tree or stats[pid][0] in tree:
            tree.add(pid)
            out.append((pid, stats[pid][1]))
    return out


def _parent_and_cpu(stat: Path, tick: int) -> tuple[int, float]:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick


def wrk(url: str, token: str, listing: Path, script: Path, connections: int, seconds: float) -> dict[str, float]:
    """wrk's summary of ``seconds`` (whole, at least 1) of load: requests, refused, p50 and p99
    ms, and ``rps``, the requests per second answered with a success."""
    env = {**os.environ, "BENCH_TOKEN": token, "BENCH_LIST": str(listing), "BENCH_BOUNDARY": BOUNDARY}
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script), url]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH "))
    doc: dict[str, float] = json.loads(line[6:])
    doc["rps"] = (doc["requests"] - doc["refused"]) / doc["seconds"]  # answered with a success only
    return doc


def warm_up(url: str, token: str, listing: Path, script: Path, connections: int, seconds: float = 3.0) -> None:
    """Requests one at a time until one is answered (the first ones verify the key, load the
    caches), then ``seconds`` of the run's load: the workers all answer before measuring."""
    path, body, kind = listing.read_text().splitlines()[0].split(" ")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": FORM if kind == "form" else MULTIPART}
    for _ in range(5):
        try:
            if httpx.post(url + path, content=Path(body).read_bytes(), headers=headers, timeout=120).status_code == 200:
                break
        except httpx.TransportError:
            pass
    wrk(url, token, listing, script, connections, seconds)
