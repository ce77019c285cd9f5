"""What one hostile upload or one wrong secret costs the service, with its limits in place.

Images: each case is decoded the way the service decodes an upload (``decode_upload`` with the
service's default settings, or ``--budget`` bytes) in a fresh interpreter, so its peak memory
is its own: the peak resident set (``VmHWM``) less the resident set just before the call,
and the peak of the allocations Python sees (``tracemalloc``: numpy's arrays, not Pillow's own
buffers). Cases: the 16-bit RGBA PNG of ``--width`` x ``--height`` pixels (of zeros: a few
hundred KB on the wire), the same decoded without the budget (what it would cost), an 8-bit
RGBA PNG at the budget, and an RGB JPEG of the full size (decoded reduced to the size the
service keeps).

Logins: a real ``msm-mem serve`` process, sent ``--requests`` requests with a wrong API-key
secret one after another from one address, with the failed-login throttle at its default
(``--max-login-failures`` 20 a minute) and with it out of reach; the server's CPU time (all
its threads, from ``/proc``) and the client's wall time per request, for the requests answered
401 (checked: an argon2 hash each, and an audit event) and 429 (refused without a hash).

Prints two Markdown tables. Usage:
  python benchmarks/bench_upload_limits.py [--width 8192 --height 4096] [--requests 60]
(``--width 512 --height 256 --budget 200000 --requests 25``: a run of seconds.)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

import httpx

HERE = Path(__file__).resolve()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_zeros(width: int, height: int, depth: int, colour: int) -> bytes:
    """A PNG of zero pixels (rows of zeros compress to almost nothing), built row by row."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    row = b"\x00" * (1 + width * channels * depth // 8)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def jpeg_noise(width: int, height: int) -> bytes:
    import numpy as np
    from PIL import Image

    tile = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    arr = np.tile(tile, (height // 256 + 1, width // 256 + 1, 1))[:height, :width]
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def case_bytes(case: str, width: int, height: int, budget: int) -> bytes:
    """The upload of ``case``."""
    if case in ("png16", "png16-nobudget"):
        return png_zeros(width, height, 16, 6)
    if case == "png8-at-budget":
        side = int((budget // 4) ** 0.5)
        return png_zeros(side, side, 8, 6)
    return jpeg_noise(width, height)


def _rss() -> int:
    """The resident set of this process now, bytes."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    """The peak resident set of this process's memory, bytes (``VmHWM``: unlike ``ru_maxrss``,
    which keeps the parent's peak across fork and exec, it starts with the interpreter)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(case: str, upload: Path, budget: int) -> dict[str, object]:
    """Decode one case's upload (made by the parent: its making is not measured) as the service
    does; what it cost (run in a fresh interpreter)."""
    from msm_mem import ImageError
    from msm_mem.interfaces.http.config import ServeConfig
    from msm_mem.interfaces.http.uploads import decode_upload

    data = upload.read_bytes()
    limit = 1 << 40 if case == "png16-nobudget" else budget
    config = ServeConfig(Path("unused"), max_image_side=65535, max_decoded_bytes=limit)
    before = _rss()
    tracemalloc.start()
    start = time.perf_counter()
    try:
        out = decode_upload(data, config)
        outcome = "decoded {}x{}".format(*reversed(getattr(out, "shape", (0, 0))))
    except ImageError as exc:
        outcome = "refused: over the budget" if "budget" in str(exc) else "refused: " + str(exc)[:60]
    seconds = time.perf_counter() - start
    traced = tracemalloc.get_traced_memory()[1]
    peak = _peak_rss()
    return {
        "bytes": len(data),
        "outcome": outcome,
        "seconds": seconds,
        "rss_mb": max(0, peak - before) / 1e6,
        "traced_mb": traced / 1e6,
    }


def images(args: argparse.Namespace) -> None:
    w, h, budget = args.width, args.height, args.budget
    cases = [
        ("png16", f"PNG {w}x{h} 16-bit RGBA"),
        ("png16-nobudget", f"PNG {w}x{h} 16-bit RGBA, no budget"),
        ("png8-at-budget", "PNG 8-bit RGBA at the budget"),
        ("jpeg", f"JPEG {w}x{h} RGB"),
    ]
    print(f"Decoded-image budget {budget:,} bytes; each case in a fresh interpreter.\n")
    print("| upload | bytes sent | outcome | seconds | peak RSS MB | peak traced MB |")
    print("|---|---:|---|---:|---:|---:|")
    for case, label in cases:
        with tempfile.TemporaryDirectory() as tmp:
            upload = Path(tmp) / "upload"
            upload.write_bytes(case_bytes(case, w, h, budget))
            cmd = [sys.executable, str(HERE), "--child", case, "--upload", str(upload), "--budget", str(budget)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"| {label} | {r['bytes']:,} | {r['outcome']} | {r['seconds']:.3f} | "
            f"{r['rss_mb']:,.1f} | {r['traced_mb']:,.1f} |"
        )


def logins(args: argparse.Namespace) -> None:
    from _loadgen import cpu_seconds
    from bench_service import serve, stop

    from msm_mem import MsmMem, Principal, Purpose, Role
    from msm_mem.interfaces.auth.apikeys import ApiKeyStore

    admin = Principal("bench-admin", Role.ADMIN, Purpose.OPERATIONS)
    print("\n| failed-login throttle | answered | requests | server CPU ms each | client ms each |")
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        MsmMem.init(work / "store", admin).close()
        token, _ = ApiKeyStore.of_store(work / "store").create(
            Principal("bench-agent", Role.AGENT, Purpose.TREATMENT), ["*"]
        )
        wrong = {"Authorization": "Bearer " + token[:-6] + "AAAAAA"}
        for label, extra in (("20 a minute (default)", ()), ("out of reach", ("--max-login-failures", "1000000"))):
            url, process = serve(work / "store", None, 1, work / "server.log", extra)
            try:
                seen: dict[int, list[tuple[float, float]]] = {}
                with httpx.Client(timeout=60) as client:
                    for _ in range(args.requests):
                        cpu0, wall0 = cpu_seconds(process.pid)[0], time.perf_counter()
                        status = client.get(url + "/v1/whoami", headers=wrong).status_code
                        cost = (cpu_seconds(process.pid)[0] - cpu0, time.perf_counter() - wall0)
                        seen.setdefault(status, []).append(cost)
            finally:
                stop(process)
            for status, costs in sorted(seen.items()):
                cpu = 1000 * sum(c for c, _ in costs) / len(costs)
                wall = 1000 * sum(w for _, w in costs) / len(costs)
                print(f"| {label} | {status} | {len(costs)} | {cpu:.1f} | {wall:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=8192)
    p.add_argument("--height", type=int, default=4096)
    p.add_argument("--budget", type=int, default=64 * 1024 * 1024, help="decoded-image budget, bytes (the service's)")
    p.add_argument("--requests", type=int, default=60, help="wrong-secret requests per server")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--upload", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.upload, args.budget)))
        return
    images(args)
    logins(args)


if __name__ == "__main__":
    main()
