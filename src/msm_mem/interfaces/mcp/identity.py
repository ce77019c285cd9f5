"""Who an MCP call acts as, from a verified credential only: never from a tool's arguments.

- **Streamable HTTP**: every request carries ``Authorization: Bearer <token>``, checked by the
  SDK's bearer middleware through :class:`BearerVerifier`, which is the service's own
  :class:`~msm_mem.interfaces.auth.credentials.Verifier` (API keys stored as argon2 hashes with their
  principal and patient scope, or JWTs checked for signature, expiry, issuer and audience). A
  missing, unknown, revoked or expired token is answered 401 before any tool runs; a key
  revoked while a client is connected is refused from its next request on.
- **stdio**: the server acts for the one client that started it. With ``MSM_MEM_API_KEY`` set
  (an API key, or a JWT when the server verifies JWTs) that credential is verified when the
  server starts and again on every call (:class:`TokenIdentity`), so the key's principal and
  patient scope apply exactly as over HTTP and a revocation ends it. Without one, the CLI's
  configured identity (flags, ``MSM_MEM_ACTOR``/``_ROLE``/``_PURPOSE``, ``DIR/identity.json``)
  acts over the patient scope named by ``--patients`` (:class:`ConfiguredIdentity`): attribution,
  as on the command line, since whoever starts the process holds the store's key file anyway.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import anyio.to_thread
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from ... import Principal
from ..auth.credentials import Caller, Unauthenticated, Verifier

__all__ = ["BearerVerifier", "ConfiguredIdentity", "HttpIdentity", "Identity", "TokenIdentity", "caller_of"]

log = logging.getLogger("msm_mem.mcp")

#: the issuer recorded for an API key in the SDK's token (it keys the session's owner)
_API_KEY_ISSUER = "msm-mem"


class Identity(Protocol):
    """Where each call's caller comes from."""

    def caller(self) -> Caller:
        """The verified caller of the call being served; Unauthenticated otherwise."""
        ...


def _token(who: Caller, token: str) -> AccessToken:
    """The SDK's record of a verified credential: the caller in plain fields, so the session's
    owner (client id, issuer, subject) is the credential and its principal."""
    return AccessToken(
        token=token,
        client_id=who.credential_id or who.principal.id,
        scopes=[],
        subject=who.principal.id,
        claims={
            "iss": _API_KEY_ISSUER if who.credential == "api-key" else "jwt",
            "role": who.principal.role.value,
            "purpose": who.principal.purpose.value,
            "patients": list(who.patients),
            "credential": who.credential,
        },
    )


def caller_of(token: AccessToken) -> Caller:
    """The caller a :class:`BearerVerifier` verified, back from the SDK's token."""
    claims: dict[str, Any] = token.claims or {}
    principal = Principal(token.subject or "", claims["role"], claims["purpose"])
    credential = str(claims["credential"])
    return Caller(principal, tuple(claims["patients"]), credential, token.client_id)


class BearerVerifier:
    """The SDK's ``TokenVerifier`` over the service's own credential checks."""

    def __init__(self, verifier: Verifier) -> None:
        self._verifier = verifier

    async def verify_token(self, token: str) -> AccessToken | None:
        """The token's caller (an argon2 check for a new API key runs off the event loop), or
        None for any token the service would refuse; the reason is logged, the token never."""
        try:
            who = await anyio.to_thread.run_sync(self._verifier.caller, f"Bearer {token}")
        except Unauthenticated as exc:
            log.warning("refused credential: %s", exc)
            return None
        return _token(who, token)


class HttpIdentity:
    """The caller of a streamable HTTP request: the token its bearer middleware verified."""

    def caller(self) -> Caller:
        token = get_access_token()
        if token is None:
            raise Unauthenticated("no credential: send Authorization: Bearer <token>")
        return caller_of(token)


class TokenIdentity:
    """A stdio server's credential, verified now and on every call (so a revocation ends it)."""

    def __init__(self, verifier: Verifier, token: str) -> None:
        self._verifier = verifier
        self._header = f"Bearer {token.strip()}"
        self.caller()

    def caller(self) -> Caller:
        return self._verifier.caller(self._header)


class ConfiguredIdentity:
    """A stdio server's configured identity (the CLI's) over an explicit patient scope."""

    def __init__(self, principal: Principal, patients: tuple[str, ...]) -> None:
        self._caller = Caller(principal, patients, "configured")

    def caller(self) -> Caller:
        return self._caller
