"""The load side of bench_service.py: wrk (a standard HTTP load generator in C) driven by a Lua
script that POSTs multipart image bodies in turn, the bodies themselves, and the CPU time of
the server's processes (Linux ``/proc``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

__all__ = ["BOUNDARY", "LUA", "cpu_seconds", "request_list", "warm_up", "wrk"]

QUESTION = "What is the impression?"
BOUNDARY = "msmbenchboundary7d1e"

#: the wrk script: every listed request in turn (each thread starts at a random one), and the
#: summary as one JSON line (latencies in microseconds from wrk, written in milliseconds)
LUA = """
local reqs, idx = {}, 0
function init(args)
  for line in io.lines(os.getenv("BENCH_LIST")) do
    local path, file = line:match("^(%S+) (%S+)$")
    local f = io.open(file, "rb"); local body = f:read("*a"); f:close()
    reqs[#reqs + 1] = wrk.format("POST", path, {
      ["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN"),
      ["Content-Type"] = "multipart/form-data; boundary=" .. os.getenv("BENCH_BOUNDARY"),
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
  io.write(string.format('BENCH {"requests": %d, "seconds": %f, "errors": %d, "p50": %f, "p99": %f}\\n',
    s.requests, s.duration / 1e6, e.status + e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3))
end
"""


def request_list(work: Path, studies: list[tuple[str, str]], op: str) -> Path:
    """One multipart body file per study and the list wrk reads (``path file`` per line)."""
    folder = work / f"bodies-{op}"
    folder.mkdir(exist_ok=True)
    fields = {"question": QUESTION, "write_back": "true"} if op == "ask" else {}
    lines = []
    for i, (patient, image) in enumerate(studies):
        parts = b"".join(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
            for k, v in fields.items()
        )
        parts += (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="q.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        body = folder / f"{i}.bin"
        body.write_bytes(parts + Path(image).read_bytes() + f"\r\n--{BOUNDARY}--\r\n".encode())
        lines.append(f"/v1/patients/{patient}/{op} {body}")
    listing = work / f"list-{op}.txt"
    listing.write_text("\n".join(lines) + "\n")
    return listing


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and its child processes, live ones (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, total = {root}, 0.0
    for pid in sorted(stats):  # children have larger pids than their parents here
        if pid in tree or stats[pid][0] in tree:
            tree.add(pid)
            total += stats[pid][1]
    return total


def wrk(url: str, token: str, listing: Path, script: Path, connections: int, seconds: float) -> dict[str, float]:
    env = {**os.environ, "BENCH_TOKEN": token, "BENCH_LIST": str(listing), "BENCH_BOUNDARY": BOUNDARY}
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script), url]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH "))
    doc: dict[str, float] = json.loads(line[6:])
    doc["rps"] = doc["requests"] / doc["seconds"]
    return doc


def warm_up(url: str, token: str, listing: Path, script: Path, connections: int) -> None:
    """Requests one at a time until one is answered (the first ones verify the key, load the
    caches), then a few seconds of the run's load: the workers all answer before measuring."""
    path, body = listing.read_text().splitlines()[0].split(" ")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    for _ in range(5):
        try:
            if httpx.post(url + path, content=Path(body).read_bytes(), headers=headers, timeout=120).status_code == 200:
                break
        except httpx.TransportError:
            pass
    wrk(url, token, listing, script, connections, 3.0)
