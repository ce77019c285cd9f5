"""The MCP server bounds its image decodes like `serve`: at most ``max_decodes`` at once in a
process; a call that cannot get a decoder within ``decode_wait_s`` is refused as busy, and one
that can decodes as before (synthetic data only)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from msm_mem import MsmMem, MsmMemError
from msm_mem.interfaces.http.config import ServeConfig
from msm_mem.interfaces.mcp.config import McpConfig
from msm_mem.interfaces.mcp.identity import ConfiguredIdentity
from msm_mem.interfaces.mcp.images import image_of
from msm_mem.interfaces.mcp.state import McpState
from tests.helpers import ADMIN, AGENT, png


def test_a_busy_decoder_refuses_and_a_free_one_decodes(tmp_path: Path) -> None:
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        config = McpConfig(ServeConfig(tmp_path / "s", max_decodes=1, decode_wait_s=0.05))
        state = McpState(mem, config, ConfiguredIdentity(AGENT, ("P1",)))
        image = base64.b64encode(png(tmp_path, 1).read_bytes()).decode()
        assert getattr(image_of(state, image, None, None), "shape", None) is not None
        assert state.throttle.decodes.acquire(timeout=1)  # the one decoder taken by another call
        try:
            with pytest.raises(MsmMemError, match=r"busy \(1 at once\)"):
                image_of(state, image, None, None)
        finally:
            state.throttle.decodes.release()
        assert getattr(image_of(state, image, None, None), "shape", None) is not None
        assert image_of(state, None, None, "S1") is None  # a stored study: read by the operation
