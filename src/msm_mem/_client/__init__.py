"""The clients of ``msm-mem serve``: :class:`MemoryClient` and :class:`AsyncMemoryClient`, the
same operations as :class:`~msm_mem.MsmMem` over HTTP, as the principal of their bearer
credential.

:mod:`.calls` builds each operation's request once, :mod:`.decode` turns the service's JSON
into the library's frozen records; :mod:`.sync` and :mod:`.asynchronous` only send them. They
need ``httpx`` (the ``client`` extra), imported when a client is made.
"""

from __future__ import annotations

from .asynchronous import AsyncMemoryClient
from .sync import MemoryClient

__all__ = ["AsyncMemoryClient", "MemoryClient"]
