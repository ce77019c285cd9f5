"""What the operation groups of :class:`~msm_mem.MsmMem` share: the core holding its private
components and the role check that audits a refusal, the group base reading them, and the
turn-taking of writers of one patient."""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from .._agent.agent import MemoryAgent
from .._clock import Clock
from .._errors import AccessDenied, InvalidInput, WriteConflict
from .._governance.anonymise import plain_reason
from .._governance.audit.log import AuditLog
from .._governance.crypto import EnvelopeCipher
from .._limits import MAX_TEXT_CHARS, check_text
from .._memory.maintenance import Maintainer
from .._memory.tiers import GovernedMemory
from .._principal import Principal
from .._settings import Settings
from .._storage.base import Store, WriteBatch
from ..plugins.encoders import Encoder
from .access import Operation, require

__all__ = ["Core", "_Base", "patient_turn", "retrying", "stated_reason"]

#: how often a write that met another writer's change is staged again before WriteConflict
CONFLICT_ATTEMPTS = 6

T = TypeVar("T")


#: how long a writer waits for another writer of the same patient (seconds); past it, it goes
#: on and the store's conflict check (and :func:`retrying`) decides
PATIENT_WAIT_S = 60.0


@contextmanager
def patient_turn(directory: Path, store_id: str, patient_id: str) -> Iterator[None]:
    """Writers of one patient on this machine take turns: an exclusive ``flock`` on
    ``DIR/locks/<digest>.lock`` (the digest keys the patient id with the store's id; the file
    holds nothing) for the whole write, waited for at most :data:`PATIENT_WAIT_S`. Writers on
    other machines (service workers of a PostgreSQL store elsewhere) are not held by it:
    :func:`retrying` covers them. No lock where the directory cannot hold one (read-only, or
    a platform without ``flock``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    digest = hashlib.sha256(f"{store_id}\x1f{patient_id}".encode()).hexdigest()[:32]
    try:
        folder = directory / "locks"
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(folder / f"{digest}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + PATIENT_WAIT_S
        held = False
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


def retrying(call: Callable[[], T]) -> T:
    """``call()``, staged again (after a short random pause that grows with each attempt) when
    another writer of the same patient committed first and the store refused the write as stale
    (:class:`WriteConflict`: nothing of it was written). Concurrent writers of one patient so
    wait for each other instead of failing; after :data:`CONFLICT_ATTEMPTS` the conflict is
    raised (409 over HTTP). Each refused attempt is in the audit trail as a failed turn."""
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        try:
            return call()
        except WriteConflict:
            if attempt == CONFLICT_ATTEMPTS:
                raise
            time.sleep(random.uniform(0.0, 0.02 * attempt))
    raise AssertionError("unreachable")


def stated_reason(reason: str, what: str) -> str:
    """A caller's free-text reason as the audit tier keeps it (break-glass, shredding, key
    rotation): non-empty clean text, passed through the allow-list anonymiser (a name, place,
    date or number becomes its category); :class:`InvalidInput` when nothing of it survives."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput(f"{what} needs a stated reason")
    return plain_reason(f"the {what} reason", check_text(f"{what} reason", reason, MAX_TEXT_CHARS).strip())


class Core:
    """The private parts of one open :class:`~msm_mem.MsmMem` (its directory, settings, clock,
    encoder, store, cipher, audit log, memory core and agent) and the helpers every operation
    group uses: the audited role check, one audit event, the maintainer. Built once by
    ``MsmMem``; each group reads it, none hands it out."""

    __slots__ = ("agent", "audit", "cipher", "clock", "directory", "encoder", "gm", "settings", "store")

    def __init__(
        self,
        directory: Path,
        settings: Settings,
        clock: Clock,
        encoder: Encoder,
        store: Store,
        cipher: EnvelopeCipher,
        audit: AuditLog,
        gm: GovernedMemory,
        agent: MemoryAgent,
    ) -> None:
        self.directory = directory
        self.settings = settings
        self.clock = clock
        self.encoder = encoder
        self.store = store
        self.cipher = cipher
        self.audit = audit
        self.gm = gm
        self.agent = agent

    def maintainer(self, system: Principal | None = None, at: float | None = None) -> Maintainer:
        """The maintenance sweep over this memory (as ``system`` when given, as of ``at``)."""
        after, keep = self.settings.consolidate_after_s, self.settings.retention_s
        if system is None:
            return Maintainer(self.gm, self.cipher, consolidate_after_s=after, at=at, retention_s=keep)
        return Maintainer(self.gm, self.cipher, consolidate_after_s=after, system=system, at=at, retention_s=keep)

    def allow(self, principal: Principal, op: Operation, *, tier: str = "ltm") -> Principal:
        """``principal`` when its role may call ``op``; a refusal is audited, then raised."""
        try:
            return require(principal, op)
        except AccessDenied:
            assert isinstance(principal, Principal)  # require raised InvalidInput otherwise
            self.event(principal, op.value, tier, tier, outcome="denied", reason="role_not_allowed")
            raise

    def event(
        self,
        principal: Principal,
        action: str,
        source: str,
        target: str,
        *,
        batch: WriteBatch | None = None,
        outcome: str = "success",
        record_ids: tuple[str, ...] = (),
        patient: str = "",
        consent_id: str = "",
        reason: str = "",
    ) -> None:
        """Write one audit event by ``principal`` (with ``batch``, in one transaction)."""
        spec = self.audit.spec(
            actor=principal.id,
            role=principal.role.value,
            action=action,
            source_tier=source,
            target_tier=target,
            purpose=principal.purpose.value,
            outcome=outcome,
            record_ids=record_ids,
            patient=patient,
            consent_id=consent_id,
            reason=reason,
        )
        self.audit.write(batch if batch is not None else WriteBatch(), [spec])


class _Base:
    """An operation group of :class:`~msm_mem.MsmMem` (care, reads, admin, ...): a plain object
    built over the one :class:`Core`, whose parts it reads through the private properties below
    (``self._store`` and so on) and whose helpers it calls (``self._allow``, ``self._event``,
    ``self._maintainer``). ``MsmMem`` holds one of each group and exposes their public methods."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._allow = core.allow
        self._event = core.event
        self._maintainer = core.maintainer

    @property
    def _directory(self) -> Path:
        return self._core.directory

    @property
    def _settings(self) -> Settings:
        return self._core.settings

    @property
    def _clock(self) -> Clock:
        return self._core.clock

    @property
    def _encoder(self) -> Encoder:
        return self._core.encoder

    @property
    def _store(self) -> Store:
        return self._core.store

    @property
    def _cipher(self) -> EnvelopeCipher:
        return self._core.cipher

    @property
    def _audit(self) -> AuditLog:
        return self._core.audit

    @property
    def _gm(self) -> GovernedMemory:
        return self._core.gm

    @property
    def _agent(self) -> MemoryAgent:
        return self._core.agent
