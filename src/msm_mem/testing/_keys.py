"""An in-memory key provider and wrapped-key store: envelope encryption with nothing on disk."""

from __future__ import annotations

import threading
from dataclasses import replace

from .._governance.keys import KekRing, new_kek
from .._tier_records import WrappedKey

__all__ = ["InMemoryKeyProvider", "InMemoryWrappedKeyStore"]


class InMemoryKeyProvider(KekRing):
    """A :class:`~msm_mem._governance.keys.KeyProvider` whose KEKs live only in memory: one fresh
    random KEK to start with; rotated and retired like a key file, gone with the process."""

    def __init__(self) -> None:
        kek_id, kek = new_kek()
        super().__init__({kek_id: kek}, kek_id)


class InMemoryWrappedKeyStore:
    """A :class:`~msm_mem._governance.keys.WrappedKeyStore` in a dict (tests, examples); thread-safe."""

    def __init__(self) -> None:
        self._by_patient: dict[str, WrappedKey] = {}
        self._lock = threading.Lock()

    def get(self, patient_ref: str) -> WrappedKey | None:
        with self._lock:
            return self._by_patient.get(patient_ref)

    def get_by_id(self, key_id: str) -> WrappedKey | None:
        with self._lock:
            for key in self._by_patient.values():
                if key.key_id == key_id:
                    return key
            return None

    def put(self, key: WrappedKey) -> None:
        with self._lock:
            self._by_patient[key.patient_ref] = key

    def shred(self, patient_ref: str, tomb_ref: str | None = None) -> None:
        with self._lock:
            key = self._by_patient.pop(patient_ref, None)
            if key is not None:
                ref = patient_ref if tomb_ref is None else tomb_ref
                self._by_patient[ref] = replace(key, patient_ref=ref, wrapped=b"", shredded=True)

    def all(self) -> list[WrappedKey]:
        with self._lock:
            return list(self._by_patient.values())
