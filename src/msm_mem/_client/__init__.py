"""The clients of ``msm-mem serve``: :class:`MemoryClient` and :class:`AsyncMemoryClient`, the
same operations as :class:`~msm_mem.MsmMem` over HTTP, as the principal of their bearer
credential.

:mod:`.operations` writes each operation once, as a plan yielding the requests of
:mod:`.calls`; :mod:`.decode` turns the service's JSON into the library's frozen records;
:mod:`.sync` and :mod:`.asynchronous` only run the plans, blocking or awaiting each request.
They need ``httpx`` (the ``client`` extra), imported when a client is made.
"""

from __future__ import annotations

from .asynchronous import AsyncMemoryClient
from .sync import MemoryClient

__all__ = ["AsyncMemoryClient", "MemoryClient"]
