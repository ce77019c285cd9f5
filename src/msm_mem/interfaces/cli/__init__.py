"""The msm-mem command line: a thin layer over :class:`msm_mem.MsmMem`.

:mod:`.registry` holds the ``command`` decorator, the parser and :func:`main`; each other
module registers one group of commands when imported here (the registry imports none of them).
Every command on a store acts as an explicit principal: see :mod:`.identity`.
"""

from __future__ import annotations

from .registry import COMMANDS, build_parser, main

# the modules register their commands when imported, in this order: the order of the command list
# isort: off
from . import store, ask, reads, consent, keys, audit, maintain, serve, mcp, evaluate  # noqa: F401
# isort: on

__all__ = ["COMMANDS", "build_parser", "main"]
