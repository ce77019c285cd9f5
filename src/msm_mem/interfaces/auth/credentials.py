"""The credential of a request: a bearer token verified into a principal and a patient scope.

Two kinds of token, told apart by their form:

- an API key (``msmk_...``, see :mod:`.apikeys`): its stored record names the principal and
  the scope;
- a JWT, when the server has a JWT key: signature, expiry
  (``exp``), issuer (``iss``) and audience (``aud``) are checked, and the claims ``sub`` (the
  actor), ``role``, ``purpose`` and ``patients`` (a list of ids, or ``"*"``) name the principal
  and the scope. A token without them is refused.

Nothing in a request's body, query or other headers can name a principal: the principal of
every call is the credential's. Anything missing, malformed, unknown, revoked, expired or
forged is refused the same way (401), and the token never reaches a log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ... import InvalidInput, Principal
from .apikeys import ALL_PATIENTS, ApiKeyStore, parse_patients

__all__ = ["Caller", "Unauthenticated", "Verifier"]


class Unauthenticated(Exception):
    """No valid credential (answered as a 401 problem); the message says which rule failed
    and never holds the token."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: the principal, its patient scope (ids, or ``("*",)``) and the kind of
    credential (``api-key`` or ``jwt``) with its id (the key id, or the token's ``jti``)."""

    principal: Principal
    patients: tuple[str, ...]
    credential: str
    credential_id: str = ""

    def covers(self, patient_id: str) -> bool:
        """Whether ``patient_id`` ("*": every patient) lies inside the scope."""
        if ALL_PATIENTS in self.patients:
            return True
        return patient_id != ALL_PATIENTS and patient_id in self.patients


def _jwt_key(path: Path) -> tuple[object, list[str]]:
    """The verification key in ``path`` and the algorithms it allows."""
    data = path.read_bytes()
    if b"-----BEGIN" not in data:
        secret = data.strip()
        if len(secret) < 32:
            raise InvalidInput(f"{path}: an HMAC secret needs at least 32 bytes")
        return secret, ["HS256"]
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    key = load_pem_public_key(data)
    if isinstance(key, rsa.RSAPublicKey):
        return key, ["RS256"]
    if isinstance(key, ec.EllipticCurvePublicKey):
        return key, ["ES256"]
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key, ["EdDSA"]
    raise InvalidInput(f"{path}: use an RSA, EC (P-256) or Ed25519 public key, or an HMAC secret")


class Verifier:
    """Verifies bearer tokens for one server: the API keys of the store at ``store``, and JWTs
    when ``jwt_key`` names a verification key (a PEM public key or an HMAC secret of at least
    32 bytes), checked against ``issuer`` and ``audience``."""

    def __init__(
        self, store: Path, *, jwt_key: Path | None = None, issuer: str | None = None, audience: str | None = None
    ) -> None:
        self.keys = ApiKeyStore.of_store(store)
        self._jwt: tuple[object, list[str]] | None = None
        if jwt_key is not None:
            self._jwt = _jwt_key(jwt_key)
        self._issuer = issuer
        self._audience = audience

    def caller(self, authorization: str | None) -> Caller:
        """The caller of a request with this ``Authorization`` header; Unauthenticated otherwise."""
        if not authorization:
            raise Unauthenticated("no credential: send Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header must be Bearer <token>")
        if token.startswith("msmk_"):
            key = self.keys.verify(token)
            if key is None:
                raise Unauthenticated("unknown, revoked or malformed API key")
            return Caller(key.principal, key.patients, "api-key", key.key_id)
        if self._jwt is not None and token.count(".") == 2:
            return self._from_jwt(token)
        raise Unauthenticated("unknown kind of token")

    def known(self, authorization: str | None) -> Caller | None:
        """The caller of an API key this server verified before (cheap: no hash computed), or
        None: then :meth:`caller` decides."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token.startswith("msmk_"):
            return None
        key = self.keys.known(token)
        return None if key is None else Caller(key.principal, key.patients, "api-key", key.key_id)

    def _from_jwt(self, token: str) -> Caller:
        import jwt

        assert self._jwt is not None
        key, algorithms = self._jwt
        try:
            claims = jwt.decode(
                token,
                key,  # type: ignore[arg-type]
                algorithms=algorithms,
                audience=self._audience,
                issuer=self._issuer,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the token has expired") from None
        except jwt.InvalidTokenError as exc:
            raise Unauthenticated(f"invalid token ({type(exc).__name__})") from None
        try:
            principal = Principal(claims["sub"], claims["role"], claims["purpose"])
            raw = claims.get("patients", [])
            patients = parse_patients(raw if isinstance(raw, str) else ",".join(_strings(raw)))
        except (KeyError, TypeError, InvalidInput):
            raise Unauthenticated("the token's claims do not name a principal (sub, role, purpose, patients)") from None
        return Caller(principal, patients, "jwt", str(claims.get("jti", "")))


def _strings(value: object) -> Sequence[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("patients must be a list of ids or '*'")
    return value
