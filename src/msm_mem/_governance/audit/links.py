"""Whether the key and pseudonym tables still fit the chain they are named in.

Events name patients by pseudonym; the pseudonym table links each pseudonym to its patient,
encrypted with that patient's data key; the key table holds each patient's data key, wrapped.
Neither table is summed into the row digests (:mod:`msm_mem._storage.row_digest`): their rows
are written in their own short transactions, before the commit that first names them. Full
verification checks instead what a change to them breaks:

* every pseudonym an event names has its row, unless an erasure event named it (erasure
  deletes the link): a row deleted in the database orphans that patient's access history;
* every patient's wrapped key opens that patient's pseudonym link: a wrapped key swapped with
  another patient's, or otherwise changed, no longer decrypts it (every read of the patient
  would fail, and the verdict says so first).

Reads only; the keys are used in this process, never in verification's worker processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..._errors import DecryptionError
from ..._storage.base import Store
from ..crypto import EnvelopeCipher
from .verify import VerifyResult

__all__ = ["LinkScan", "check_links"]

_PATIENT = re.compile(rb'"patient":"(pt-[0-9a-f]{24})"')
_ERASURE = b'"purpose":"erasure"'


@dataclass(slots=True)
class LinkScan:
    """The pseudonyms the events of a walk name, and those named by erasure events."""

    named: set[bytes] = field(default_factory=set)
    erased: set[bytes] = field(default_factory=set)

    def add(self, payload: bytes) -> None:
        """Note the pseudonym one event's canonical payload names (if any)."""
        match = _PATIENT.search(payload)
        if match is None:
            return
        self.named.add(match.group(1))
        if _ERASURE in payload:
            self.erased.add(match.group(1))


def check_links(scan: LinkScan, store: Store, cipher: EnvelopeCipher, chain: VerifyResult) -> VerifyResult:
    """``chain`` when the pseudonym and key tables fit the events of ``scan``; otherwise a
    failure naming what was changed in the database."""
    keys = store.keys()
    links = keys.pseudonyms()
    stored = {pseudonym.encode("ascii") for pseudonym, _ in links.values()}
    orphans = scan.named - stored - scan.erased
    if orphans:
        reason = (
            f"{len(orphans)} pseudonyms named by audit events have no row in the pseudonym table and no erasure"
            " names them: deleted in the database, which orphans those patients' access histories"
        )
        return VerifyResult(False, chain.count, chain.head_hash, None, reason)
    bad = []
    for key in keys.all():
        link = links.get(key.key_id)
        if key.shredded or link is None:
            continue
        pseudonym, token = link
        try:
            opened = cipher.decrypt_field(key.patient_ref, "pseudonyms", pseudonym, "patient_ref", token)
        except DecryptionError:
            opened = ""
        if opened != key.patient_ref:
            bad.append(key.key_id)
    if bad:
        reason = (
            f"{len(bad)} wrapped data keys do not open their patient's pseudonym link (first: key {sorted(bad)[0]}):"
            " swapped between patients or changed in the database; those patients' records cannot be read"
        )
        return VerifyResult(False, chain.count, chain.head_hash, None, reason)
    return chain
