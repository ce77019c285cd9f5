"""The memory as a service: ``msm-mem serve`` (FastAPI on uvicorn) over :class:`msm_mem.MsmMem`.

A thin layer like the command line: each endpoint parses its request, calls one ``MsmMem``
operation as the principal of the verified credential, and renders the result.

- :mod:`.config`: the frozen server settings (store, limits, token verification).
- :mod:`msm_mem.interfaces.auth`: the credential of a request (API key or JWT) -> principal
  and patient scope, shared with the MCP server.
- :mod:`.problems`: every error as an RFC 9457 problem, in one place.
- :mod:`.models`: the validated request and response bodies.
- :mod:`.uploads`: an uploaded image's format and size checked before decoding (no web framework).
- :mod:`.state`: what the endpoints share (the open store, its lock, the scope check, uploads).
- :mod:`.routes`: one module per group of endpoints.
- :mod:`.app`: the app factory; :mod:`.serve`: uvicorn.

Everything here needs the ``server`` extra,
imported only when a server is made (``msm-mem serve`` imports it lazily).
"""
