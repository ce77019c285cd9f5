"""The envelope-encryption codec at the repository boundary: the governance layer's FieldCodec
(the protocol and the PHI fields it guards are in :mod:`msm_mem._storage.codec`)."""

from __future__ import annotations

from .._errors import DecryptionError
from .._storage.base import WrappedKeyTable
from .._storage.codec import SHREDDED
from .crypto import EnvelopeCipher, is_token

__all__ = ["SHREDDED", "EnvelopeCodec"]


class EnvelopeCodec:
    """Encrypts every PHI field with the patient's data key; AAD binds table, record, field.

    Anonymised records (patient id ``""``) use the population key. Reading a field of a
    patient whose key was shredded gives :data:`SHREDDED`; any other failure (a token moved to
    another record, tampered bytes, plain text where a token belongs) raises DecryptionError.
    """

    encrypting = True  # the store accepts only a codec that says so

    def __init__(self, cipher: EnvelopeCipher, keys: WrappedKeyTable) -> None:
        self.cipher = cipher
        self._keys = keys
        self._shredded: set[str] = set()

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return self.cipher.encrypt_field(patient_id, table, record_id, field, value)

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        try:  # decrypt_field checks the token's form itself: not matched twice on every read
            return self.cipher.decrypt_field(patient_id, table, record_id, field, value)
        except DecryptionError:
            if not is_token(value):
                raise DecryptionError(f"{table}.{field} of {record_id} is not an encrypted token") from None
            if patient_id in self._shredded:
                return SHREDDED
            if self.cipher.is_shredded(patient_id):
                self._shredded.add(patient_id)
                return SHREDDED
            raise
