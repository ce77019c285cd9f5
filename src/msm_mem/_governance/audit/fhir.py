"""Export the audit tier as FHIR R5 ``AuditEvent`` resources, and verify an export alone.

Each stored event becomes the resource :func:`~.fhir_resource.to_fhir`
makes of it (IHE BALP shapes; the mapping is documented there), with the hashed payload in an
extension, so :func:`verify_fhir` re-verifies the chain from the file alone.

Files are NDJSON (one resource per line, UTF-8, ``\\n`` after each), created mode 0600 and
published atomically; an existing file is never overwritten.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..._errors import AuditChainBroken, InvalidInput
from ..._storage.base import Store
from .checkpoint import heads_root
from .event import GENESIS, AuditEvent
from .fhir_resource import CHAIN_EXTENSION, to_fhir
from .verify import VerifyResult, fits, row_problem, verify_chain

__all__ = ["CHAIN_EXTENSION", "export_fhir", "iter_fhir", "to_fhir", "verify_fhir"]


def iter_fhir(store: Store) -> Iterator[dict[str, Any]]:
    """Yield the AuditEvent resource of every stored event, in seq order (a store of several
    chains: theirs interleaved in seq order, each checked against its own chain).

    Each row's hash, schema and canonical form and each seq/prev_hash link are checked on
    the way (raising :class:`AuditChainBroken` naming the first bad seq), so a chain broken
    in the database is never exported. Signed checkpoints are not checked here: use
    ``AuditLog.verify`` for those (the CLI does, before exporting).
    """
    n = store.audit_chains()
    bases = [store.audit_base(c) for c in range(n)]
    prev = [h for _, h in bases]
    expected = [seq + (1 if n == 1 else n) for seq, _ in bases]
    for row in store.iter_audit(min(expected)):
        c = row.seq % n
        if not fits(row.seq, expected[c], n):
            raise AuditChainBroken(f"seq {expected[c]}: slot holds seq {row.seq}", seq=expected[c])
        event = AuditEvent.from_row(row.seq, row.payload, row.event_hash)
        if event.prev_hash != prev[c]:
            raise AuditChainBroken(f"seq {row.seq}: prev_hash does not link to the previous event", seq=row.seq)
        yield to_fhir(event)
        prev[c], expected[c] = event.event_hash, row.seq + (1 if n == 1 else n)


def _line(resource: dict[str, Any]) -> bytes:
    return json.dumps(resource, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _publish(tmp: str, out: Path) -> None:
    """Give ``tmp`` the name ``out`` without ever replacing an existing file (a no-clobber rename)."""
    try:
        os.link(tmp, out)  # atomic, and fails when out exists
    except FileExistsError:
        raise InvalidInput(f"{out} already exists; refusing to overwrite it") from None
    except OSError:  # a file system without hard links: check, then rename
        if os.path.lexists(out):
            raise InvalidInput(f"{out} already exists; refusing to overwrite it") from None
        os.replace(tmp, out)


def export_fhir(store: Store, out_path: str | os.PathLike[str]) -> int:
    """Write every stored audit event as one FHIR R5 AuditEvent JSON object per line.

    The file is written to a temporary file next to ``out_path`` (mode 0600), fsynced and then
    given its name, so readers see either no file or the whole export. Returns the number of
    resources written (0 for an empty chain: an empty file). Raises :class:`InvalidInput` when
    ``out_path`` already exists (nothing is overwritten) and :class:`AuditChainBroken` when a
    stored event fails its hash or link check (nothing is published).
    """
    out = Path(out_path)
    if os.path.lexists(out):
        raise InvalidInput(f"{out} already exists; refusing to overwrite it")
    folder = out.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    count = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for resource in iter_fhir(store):
                f.write(_line(resource))
                count += 1
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, out)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return count


def _chain_row(resource: Any) -> tuple[int, bytes, str, str]:
    """``(seq, payload, event_hash, prev_hash)`` from a resource's chain extension."""
    if not isinstance(resource, dict) or resource.get("resourceType") != "AuditEvent":
        raise ValueError("not an AuditEvent resource")
    found = [e for e in resource.get("extension", ()) if isinstance(e, dict) and e.get("url") == CHAIN_EXTENSION]
    if len(found) != 1:
        raise ValueError(f"expected one {CHAIN_EXTENSION} extension, found {len(found)}")
    parts = {p.get("url"): p for p in found[0].get("extension", ()) if isinstance(p, dict)}
    seq = int(parts["seq"]["valueInteger64"])
    payload = base64.b64decode(parts["payload"]["valueBase64Binary"], validate=True)
    return seq, payload, str(parts["eventHash"]["valueString"]), str(parts["prevHash"]["valueString"])


def _mismatch(event: AuditEvent, resource: Any) -> str:
    """Why ``resource`` is not what :func:`to_fhir` makes of ``event`` ("" when it is)."""
    try:
        expected = to_fhir(event)
    except InvalidInput as exc:  # a time no FHIR instant holds: this line is not our export
        return str(exc)
    return "" if expected == resource else "resource fields disagree with its hashed payload"


def verify_fhir(
    path: str | os.PathLike[str], *, start_seq: int | None = None, start_prev: str | None = None, chains: int = 1
) -> VerifyResult:
    """Re-verify the audit chain from an NDJSON export alone.

    Every line must carry its hashed payload; the chain is verified as by
    :func:`~.verify.verify_chain` (hashes, links, schema, canonical form)
    and every resource must equal :func:`to_fhir` of its payload, so no readable field can
    disagree with what was hashed. The chain starts at ``start_seq``/``start_prev`` (default:
    the seq and prev_hash of the first line, for exports of purged stores); anchor the result
    by comparing ``head_hash`` with a signed checkpoint. ``first_bad_seq`` names the first slot
    that fails; a malformed line names the slot it occupies. The export of a store of ``chains``
    audit chains is verified chain by chain (:func:`_verify_chains`; its start is each chain's
    first line).
    """
    if chains != 1:
        return _verify_chains(path, chains)
    problem: list[str] = []
    with open(path, "rb") as f:
        lines = iter(f)
        first = next(lines, None)
        if first is None:
            return VerifyResult(True, 0, start_prev or GENESIS, None, "")

        def parse(lineno: int, line: bytes) -> tuple[int, bytes, str, str, Any] | None:
            try:
                resource = json.loads(line)
                return (*_chain_row(resource), resource)
            except (ValueError, KeyError, TypeError, binascii.Error) as exc:
                problem.append(f"line {lineno}: malformed export line ({type(exc).__name__}: {exc})")
                return None

        head = parse(1, first)
        if head is None:
            return VerifyResult(False, 0, start_prev or GENESIS, start_seq, problem[0])
        seq0 = head[0] if start_seq is None else start_seq
        prev0 = head[3] if start_prev is None else start_prev

        def rows() -> Iterator[tuple[int, bytes, str]]:
            parsed: tuple[int, bytes, str, str, Any] | None = head
            lineno = 1
            while parsed is not None:
                seq, payload, digest, _, resource = parsed
                try:
                    event = AuditEvent.from_row(seq, payload, digest)
                except (AuditChainBroken, InvalidInput):
                    pass  # verify_chain names this slot's exact problem
                else:
                    mismatch = _mismatch(event, resource)
                    if mismatch:
                        problem.append(f"line {lineno}: {mismatch}")
                        return
                yield seq, payload, digest
                line = next(lines, None)
                lineno += 1
                parsed = None if line is None else parse(lineno, line)

        try:
            result = verify_chain(rows(), start_seq=seq0, start_prev=prev0)
        except InvalidInput as exc:  # a first line naming an impossible start
            return VerifyResult(False, 0, GENESIS, None, f"line 1: {exc}")
    if not result.ok or not problem:
        return result
    return VerifyResult(False, result.count, result.head_hash, seq0 + result.count, problem[0])


def _verify_chains(path: str | os.PathLike[str], chains: int) -> VerifyResult:
    """:func:`verify_fhir` of the export of a store of ``chains`` chains: each line the full
    check of its chain's next slot (seq of its residue, link to that chain's last line, hash,
    schema, canonical form) and equal to :func:`to_fhir` of its payload. ``head_hash`` is the
    root of the chains' last hashes (:func:`~.checkpoint.heads_root`)."""
    if type(chains) is not int or chains < 1:
        raise InvalidInput(f"chains must be an integer >= 1, got {chains!r}")
    heads: dict[int, tuple[int, str]] = {}
    count = 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            try:
                resource = json.loads(line)
                seq, payload, digest, prev = _chain_row(resource)
            except (ValueError, KeyError, TypeError, binascii.Error) as exc:
                reason = f"line {lineno}: malformed export line ({type(exc).__name__}: {exc})"
                return VerifyResult(False, count, GENESIS, None, reason)
            c = seq % chains
            last = heads.get(c)
            expected, head = (seq, prev) if last is None else (last[0] + chains, last[1])
            problem, computed = row_problem((seq, payload, digest), expected, head, chains)
            if problem is None:
                problem = _mismatch(AuditEvent.from_row(seq, payload, digest), resource) or None
            if problem is not None:
                return VerifyResult(False, count, head, seq, f"seq {seq}: line {lineno}: {problem}")
            heads[c] = (seq, computed)
            count += 1
    root = heads_root(tuple(heads.get(c, (c, GENESIS)) for c in range(chains)))
    return VerifyResult(True, count, root, None, "")
