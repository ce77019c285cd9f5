"""The MCP server's settings: one frozen object, made by the ``mcp`` command."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ... import InvalidInput
from ..http.config import ServeConfig

__all__ = ["McpConfig"]


@dataclass(frozen=True, slots=True)
class McpConfig:
    """How one MCP server runs: ``server`` holds the store, the input limits and the JWT
    settings, the same as ``msm-mem serve`` (see :class:`~msm_mem.interfaces.http.config.ServeConfig`);
    ``image_roots`` are the folders (resolved, each an existing directory) inside which a tool
    may name an image by its path. With none, images come as base64 bytes or stored studies."""

    server: ServeConfig
    image_roots: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        roots = []
        for root in self.image_roots:
            real = Path(os.path.realpath(root))
            if not real.is_dir():
                raise InvalidInput(f"image root {root} is not a directory")
            roots.append(real)
        object.__setattr__(self, "image_roots", tuple(dict.fromkeys(roots)))

    @property
    def max_image_base64(self) -> int:
        """The longest base64 text an image may take (its bytes at most ``max_upload_bytes``)."""
        return 4 * ((self.server.max_upload_bytes + 2) // 3)
