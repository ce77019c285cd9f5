"""AES-GCM with 96-bit nonces and 128-bit tags: the one primitive under field encryption
(:mod:`.crypto`) and key wrapping (:mod:`.keys`)."""

from __future__ import annotations

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .._errors import DecryptionError, InvalidInput

__all__ = ["aes_gcm_decrypt", "aes_gcm_encrypt"]

_NONCE_BYTES = 12
_TAG_BYTES = 16


def aes_gcm_encrypt(key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-GCM with a 128-bit tag: return ``ciphertext || tag`` (len(plaintext) + 16 bytes).

    ``key`` must be 16, 24 or 32 bytes and ``nonce`` 12 bytes (96 bits, the size GCM is
    designed for); a nonce must never repeat under one key. InvalidInput otherwise.
    """
    _check_key_nonce(key, nonce)
    return AESGCM(key).encrypt(nonce, plaintext, aad)


def aes_gcm_decrypt(key: bytes, nonce: bytes, ciphertext_with_tag: bytes, aad: bytes) -> bytes:
    """Inverse of :func:`aes_gcm_encrypt`; DecryptionError if authentication fails."""
    _check_key_nonce(key, nonce)
    if len(ciphertext_with_tag) < _TAG_BYTES:
        raise DecryptionError("ciphertext shorter than the 16-byte tag")
    try:
        return AESGCM(key).decrypt(nonce, ciphertext_with_tag, aad)
    except InvalidTag as exc:
        raise DecryptionError("authentication failed") from exc


def _check_key_nonce(key: bytes, nonce: bytes) -> None:
    if len(key) not in (16, 24, 32):
        raise InvalidInput(f"AES key must be 16, 24 or 32 bytes, got {len(key)}")
    if len(nonce) != _NONCE_BYTES:
        raise InvalidInput(f"GCM nonce must be {_NONCE_BYTES} bytes, got {len(nonce)}")
