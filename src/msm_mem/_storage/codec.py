"""The PHI field codec at the storage boundary, and the fields it guards.

A store holds no codec until :meth:`~msm_mem._storage.base.Store.use_codec` gives it one, and
until then it refuses to write or read any PHI field (:class:`StoreError`), so no patient data
can land in plain text beside encrypted rows. It accepts only a codec that declares itself
encrypting (the governance layer's envelope codec does); the codec itself lives above storage.
"""

from __future__ import annotations

from typing import Protocol

from .._errors import StoreError

__all__ = ["PII_FIELDS", "SHREDDED", "FieldCodec", "NoCodec", "encrypting_codec"]

#: what a codec returns for a field of a crypto-shredded patient (part of the codec contract, so
#: the store can tell a destroyed field from a damaged one)
SHREDDED = "[shredded]"

#: Fields of each table that hold patient data and go through the codec. Everything else is in
#: clear and holds only ids, vectors, times, states, scores and closed vocabularies (evidence
#: tiers, categories; consent purposes are a closed enum and grantees are ``actor:<id>`` or
#: ``role:<role>``, ids).
PII_FIELDS: dict[str, tuple[str, ...]] = {
    "episodic": ("question", "answer", "decision", "media_path", "media_description"),
    "visual": ("media_path", "visual_tag"),
    "semantic": ("impressions",),
    "stm": ("payload",),
    "claims": ("content", "source"),
    "entities": ("name",),
}


class FieldCodec(Protocol):
    """Turns a PHI field into its stored form and back (the repository boundary)."""

    @property
    def encrypting(self) -> bool:
        """True when the stored form is a ciphertext; a store refuses a codec without it."""
        ...

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str: ...

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str: ...


class NoCodec:
    """The codec of a store not given one yet: every PHI field is refused."""

    encrypting = False

    def _refuse(self, table: str, field: str) -> StoreError:
        return StoreError(f"{table}.{field} is patient data and this store has no codec: call use_codec first")

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        raise self._refuse(table, field)

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        raise self._refuse(table, field)


def encrypting_codec(codec: FieldCodec) -> FieldCodec:
    """``codec`` when it declares itself encrypting; :class:`StoreError` otherwise."""
    if getattr(codec, "encrypting", False) is not True:
        raise StoreError(f"{type(codec).__name__} is not an encrypting codec; PHI is stored encrypted only")
    return codec
