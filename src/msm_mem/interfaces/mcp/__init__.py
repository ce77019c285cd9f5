"""The memory for agents over MCP: ``msm-mem mcp`` (the official ``mcp`` SDK) over :class:`msm_mem.MsmMem`.

A thin layer like the command line and the HTTP service: each tool and resource checks its
input, calls one ``MsmMem`` operation as the authenticated principal, and renders the result
with the HTTP service's response models.

- :mod:`.config`: the frozen settings (the service's limits and token checks, image folders).
- :mod:`.identity`: who a call acts as: the verified bearer token of the request (streamable
  HTTP, through the service's own API key and JWT checks), or the one identity the stdio
  server was started with (an API key, or the configured CLI identity with a patient scope).
- :mod:`.problems`: results and errors, each error as its RFC 9457 problem type.
- :mod:`.state`: what the tools share: the open store and its lock, the patient scope check,
  one governed call.
- :mod:`.images`: a tool's image: base64 bytes, a file inside an allowed folder, or a stored study.
- :mod:`.tools`, :mod:`.reads`: the tools; :mod:`.resources`: the resources.
- :mod:`.server`: the server itself (argument checks) and its two transports.

Everything here needs the ``mcp`` extra; the CLI imports it only when ``msm-mem mcp`` runs.
"""
