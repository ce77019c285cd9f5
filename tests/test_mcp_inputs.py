"""Bad input to ``msm-mem mcp``, over both transports: each refused with its problem type and a
message naming what is wrong (never the value), and nothing stored, the audit tier included."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client
from PIL import Image

from tests.helpers import png
from tests.http_support import OWN, QUESTION
from tests.mcp_support import (
    McpHttp,
    counts,
    http_client,
    png_base64,
    problem,
    run,
    stdio_client,
)

pytestmark = pytest.mark.system


def _bad_calls(images: Path) -> list[tuple[str, dict[str, Any], str]]:
    """(tool, arguments, problem slug): each must be refused before anything is stored."""
    wide = images / "wide.png"
    Image.fromarray(np.zeros((8, 4096), dtype=np.uint8), mode="L").save(wide)
    outside = images.parent / "outside.png"
    shutil.copy(png(images, 1), outside)
    link = images / "link.png"
    if not link.exists():
        link.symlink_to(outside)
    fifo = images / "pipe.png"
    if not fifo.exists():
        os.mkfifo(fifo)
    image = png_base64(png(images, 61))
    ask = {"patient_id": OWN, "question": QUESTION}
    big = base64.b64encode(os.urandom(1_100_000)).decode()
    return [
        ("ask", {**ask, "image_base64": image, "actor": "someone-else"}, "invalid-input"),
        ("ask", {**ask, "image_base64": image, "role": "admin"}, "invalid-input"),
        ("ask", {**ask, "patient_id": "PHI-Smith 1", "image_base64": image}, "invalid-input"),
        ("ask", {**ask, "patient_id": "P" * 129, "image_base64": image}, "invalid-input"),
        ("ask", {**ask, "patient_id": "P\x00X", "image_base64": image}, "invalid-input"),
        ("ask", {**ask, "question": "", "image_base64": image}, "invalid-input"),
        ("ask", {**ask, "question": "   ", "image_base64": image}, "invalid-input"),
        ("ask", {**ask, "question": "x" * 2001, "image_base64": image}, "invalid-input"),
        ("ask", {**ask, "image_base64": "not base64 at all!"}, "invalid-input"),
        ("ask", {**ask, "image_base64": base64.b64encode(b"PHI-Smith's notes").decode()}, "image-error"),
        ("ask", {**ask, "image_base64": big}, "invalid-input"),
        ("ask", {**ask, "image_base64": png_base64(wide)}, "image-error"),
        ("ask", {**ask, "image_base64": image, "image_study": "S0"}, "invalid-input"),
        ("ask", dict(ask), "invalid-input"),
        ("ask", {**ask, "image_path": "/etc/hostname"}, "invalid-input"),
        ("ask", {**ask, "image_path": "../outside.png"}, "invalid-input"),
        ("ask", {**ask, "image_path": "link.png"}, "invalid-input"),
        ("ask", {**ask, "image_path": "pipe.png"}, "image-error"),
        ("ask", {**ask, "image_path": "missing.png"}, "image-error"),
        ("observe", {**ask, "image_base64": image, "timestamp": 1e20}, "invalid-input"),
        ("retrieve", {"patient_id": OWN, "image_base64": image, "k": 0}, "invalid-input"),
        ("retrieve", {"patient_id": OWN, "image_base64": image, "k": 101}, "invalid-input"),
        ("retrieve", {"patient_id": OWN, "image_base64": image, "scope": "everyone"}, "invalid-input"),
        ("consolidate", {"patient_id": OWN, "item_id": "", "answer": "Effusion."}, "invalid-input"),
        (
            "feedback",
            {"patient_id": OWN, "study_id": "S0", "accept": False, "correction": "x" * 20_001},
            "invalid-input",
        ),
        ("feedback", {"patient_id": OWN, "study_id": "S0"}, "invalid-input"),
        ("patient_history", {"patient_id": OWN, "limit": 0}, "invalid-input"),
    ]


async def _bad_input(client: Client, directory: Path, images: Path) -> None:
    for tool, arguments, kind in _bad_calls(images):
        before = counts(directory)
        doc = problem(await client.call_tool(tool, arguments))
        label = (tool, sorted(arguments), kind)
        assert doc["type"] == f"urn:msm-mem:problem:{kind}", (label, doc)
        assert doc["status"] in (400, 422) and doc["detail"], (label, doc)
        assert "PHI-Smith" not in json.dumps(doc), (label, doc)
        assert counts(directory) == before, label


def test_bad_input_is_refused_with_nothing_stored_over_http(mcp_http: McpHttp) -> None:
    """Unknown arguments (a principal cannot be named), malformed ids, out-of-range k and
    times, empty or oversized text, images that are not base64, not images, too large, too
    wide, ambiguous, missing, or outside the image folders: each an invalid-input or
    image-error problem naming what is wrong (never echoing the value), and no row written,
    the audit tier included."""

    async def scenario() -> None:
        async with http_client(mcp_http.url, mcp_http.tokens["agent"]) as agent:
            await _bad_input(agent, mcp_http.directory, mcp_http.root / "images")

    run(scenario)


def test_bad_input_is_refused_with_nothing_stored_over_stdio(
    mcp_stdio_store: tuple[Path, Path, dict[str, str]],
) -> None:
    """The same over stdio."""
    root, directory, tokens = mcp_stdio_store

    async def scenario() -> None:
        async with stdio_client(root, directory, MSM_MEM_API_KEY=tokens["agent"]) as agent:
            await _bad_input(agent, directory, root / "images")

    run(scenario)
