"""Upgrading a store written by an older msm-mem (store schema 1 or 2), once, as an admin, audited.

A store of schema 1 may hold visual tags in clear text (now a PHI field, refused as clear
text), has no row digests, and its audit chain may have a head that no checkpoint signs (older
versions checkpointed every 10,000 events or on request); one of schema 1 or 2 has no tenant
column. :func:`upgrade_store` runs one transaction that first gives every table the tenant
column (every row the store's tenant's), then checks the chain (every hash and link, from its
base) and every checkpoint the log and the witness hold (signed by the store's key, none beyond
the chain, each matching the stored hash at its size): it adopts only a head nothing
contradicts, and refuses a chain that fails, naming the first bad seq. Then it encrypts every
clear visual tag (the tag of a crypto-shredded patient becomes a token of the destroyed key,
read back as ``[shredded]``), computes the row digests from the rows, records the current
schema and appends the audit event of the upgrade, whose checkpoint signs the new head with the
row digests. A crash or any error before the commit leaves the old store exactly as it was.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from .._errors import AccessDenied, AuditChainBroken, CanonicalJSONError, InvalidInput, NotFound
from .._storage.base import AuditChainer
from .audit.checkpoint import Checkpoint, CheckpointLog, verify_against_checkpoints
from .audit.event import AuditSpec
from .audit.log import AuditLog
from .audit.verify import verify_chain
from .crypto import TOKEN_PREFIX, EnvelopeCipher, _b64url, is_token

__all__ = ["check_adoptable", "upgrade_store"]


def _log_lines(path: Path | None, what: str) -> list[Checkpoint]:
    if path is None or not path.is_file():
        return []
    try:
        return list(CheckpointLog(path).all())
    except (CanonicalJSONError, InvalidInput) as exc:
        raise AuditChainBroken(f"the {what} {path.name} is unreadable, so the chain cannot be adopted: {exc}") from None


def check_adoptable(audit: AuditLog) -> int:
    """The stored head's seq when the chain verifies from its base and no checkpoint of the log
    or the witness contradicts it; :class:`AuditChainBroken` (first bad seq) otherwise."""
    store = audit.store
    base_seq, base_hash = store.audit_base()
    sources = {"checkpoint log": audit.place.log, "witness": audit.place.witness}
    lines = {what: _log_lines(path, what) for what, path in sources.items()}
    sizes = sorted({c.size for cs in lines.values() for c in cs if c.size > base_seq})
    seen: dict[int, str] = {}

    def rows() -> Iterator[tuple[int, bytes, str]]:
        for page in store.iter_audit_batches(base_seq + 1):
            first = page[0][0]
            for size in sizes[bisect.bisect_left(sizes, first) : bisect.bisect_left(sizes, first + len(page))]:
                if page[size - first][0] == size:
                    seen[size] = page[size - first][2]
            yield from page

    walked = verify_chain(rows(), start_seq=base_seq + 1, start_prev=base_hash)
    if not walked.ok:
        raise AuditChainBroken(
            f"the audit chain does not verify, nothing upgraded: {walked.reason}", walked.first_bad_seq
        )
    size = base_seq + walked.count
    for what, checkpoints in lines.items():
        ours = [c for c in checkpoints if c.origin == audit.origin and c.size > base_seq]
        result = verify_against_checkpoints(ours, audit.signer.public_key, seen.get, size)
        if not result.ok:
            raise AuditChainBroken(
                f"the {what} contradicts the chain, nothing upgraded: {result.reason}", result.first_bad_seq
            )
    return size


def _reencoder(cipher: EnvelopeCipher, audit: AuditLog) -> Callable[[str, str, str], str | None]:
    keys = audit.store.keys()

    def reencode(visual_id: str, patient_id: str, stored: str) -> str | None:
        if is_token(stored):
            return None
        try:
            return cipher.encrypt_field(patient_id, "visual", visual_id, "visual_tag", stored)
        except AccessDenied:  # a shredded patient: the clear tag goes, a token of the dead key stays
            key = keys.get(patient_id)
            if key is None:
                raise NotFound(f"no data key of the shredded patient of visual {visual_id!r}") from None
            return f"{TOKEN_PREFIX}:{key.key_id}:{_b64url(os.urandom(12 + 16 + len(stored.encode())))}"

    return reencode


def upgrade_store(audit: AuditLog, cipher: EnvelopeCipher, spec: AuditSpec) -> tuple[int, int]:
    """Upgrade in one transaction with the audit event ``spec``, the chain checked inside it
    (:func:`check_adoptable`); returns (visual tags encrypted, events the new checkpoint signs)."""
    done: list[int] = []

    def check() -> None:
        check_adoptable(audit)

    def apply(chain: AuditChainer, sign: Callable[[], None]) -> None:
        done.append(audit.store.upgrade(chain, _reencoder(cipher, audit), before_commit=sign, check=check))

    audit.commit(apply, [spec], adopt=True)
    return done[0], audit.store.audit_head()[0]
