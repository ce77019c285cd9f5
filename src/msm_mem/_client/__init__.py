"""The client of ``msm-mem serve``: :class:`MemoryClient`, the same operations as
:class:`~msm_mem.MsmMem` over HTTP, as the principal of its bearer credential.

:mod:`.decode` turns the service's JSON into the library's frozen records; :mod:`.sync` holds
the client. It needs ``httpx`` (the ``client`` extra), imported when a client is made.
"""

from __future__ import annotations

from .sync import MemoryClient

__all__ = ["MemoryClient"]
