"""A study's clinical time, as memory knows it: the time every record of the study carries."""

from __future__ import annotations

from .._storage.base import Store

__all__ = ["study_time"]


def study_time(store: Store, patient_id: str, study_id: str) -> float | None:
    """The clinical time (UTC seconds) of the patient's study ``study_id``: from a short-term
    item of the study, else from one of its episodes; None when memory does not know it."""
    if not study_id:
        return None
    for item in store.stm_list(patient_id=patient_id):
        if item.payload is not None and item.payload.study_id == study_id:
            return float(item.payload.timestamp)
    for e in store.get_episodes(store.record_ids("episodic", patient_id)):
        if e.study_id == study_id:
            return e.timestamp
    return None
