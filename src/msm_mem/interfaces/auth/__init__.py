"""Who is calling the service or the MCP server: one module of credentials for both.

- :mod:`.apikeys`: API keys, stored only as argon2 hashes in the key home's ``api-keys.json``
  (importing it needs only ``argon2-cffi``).
- :mod:`.credentials`: a bearer token (API key or JWT) verified into a principal and a patient
  scope (:class:`~.credentials.Caller`); anything else is :class:`~.credentials.Unauthenticated`.

The HTTP server and the MCP server both verify with :class:`~.credentials.Verifier`, so a
credential means the same on either.
"""
