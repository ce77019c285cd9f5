"""The Python API: a governed memory store directory with its encoder, memory and agent.

A store directory holds::

    msm-mem.sqlite            store of record (PHI fields envelope-encrypted), or
    store.json                where the PostgreSQL store of record is (see storage.location)
    index/                    FAISS caches of the embedded store (rebuildable)
    keys/kek.json             local key-encryption keys (mode 0600); use a KMS in production
    keys/checkpoint.key       Ed25519 key signing audit checkpoints (mode 0600)
    audit/checkpoints.jsonl   signed checkpoints of the audit chain
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._agent.agent import AgentAnswer, MemoryAgent, Query
from .._agent.offline import IngestReport, ingest_rows
from .._clock import Clock, SystemClock
from .._errors import EncoderMismatch, InvalidInput
from .._governance.audit import AuditLog
from .._governance.codec import EnvelopeCodec
from .._governance.consent import check_record, default_policy
from .._governance.crypto import EnvelopeCipher
from .._governance.keys import KeyProvider, LocalKeyFileProvider
from .._memory.maintenance import Maintainer, MaintenanceReport
from .._memory.msm import Memory
from .._memory.tiers import Actor, GovernedMemory
from .._records import ManifestRow
from .._settings import Settings
from .._storage.base import Store, WriteBatch
from .._storage.location import ServerLocation, create_store, open_store, remove_new_store
from .._storage.paper_layout import export_paper, read_paper
from .._tier_records import ConsentRecord
from ..plugins.backbones import get_backbone
from ..plugins.encoders import get_encoder

__all__ = ["ADMIN", "MsmMem"]

ADMIN = Actor("msm-mem-admin", "admin")


def _remove_new_store(directory: Path, existed: bool, store: Store) -> None:
    """Undo a half-made ``init``: remove only what init created (a server store's tables too)."""
    import shutil

    remove_new_store(directory, store)
    for sub in ("keys", "audit", "index"):
        shutil.rmtree(directory / sub, ignore_errors=True)
    if not existed:
        shutil.rmtree(directory, ignore_errors=True)


class MsmMem:
    """One governed memory store directory: ingest, ask, correct, maintain, export, audit.

    Open with :meth:`init` (new directory) or :meth:`open`; close it (or use it as a context
    manager) so the vector caches are saved.
    """

    def __init__(
        self,
        directory: Path,
        store: Store,
        provider: KeyProvider,
        settings: Settings,
        clock: Clock | None = None,
        backbone: str = "nonparametric",
    ) -> None:
        self.directory = directory
        self.store = store
        self.settings = settings
        self.clock = clock or SystemClock()
        self.encoder = get_encoder(store.encoder_name)
        if self.encoder.dim != store.dim:
            raise EncoderMismatch(f"encoder {store.encoder_name} is {self.encoder.dim}-d; the store is {store.dim}-d")
        self.cipher = EnvelopeCipher(store.tenant, provider, store.keys(), self.clock.now)
        store.use_codec(EnvelopeCodec(self.cipher, store.keys()))
        self.audit = AuditLog(store, self.cipher, directory, self.clock)
        self.memory = Memory(store, settings, self.clock)
        self.governed = GovernedMemory(self.memory, self.audit)
        self.maintainer = Maintainer(self.governed, self.cipher, consolidate_after_s=settings.consolidate_after_s)
        self.agent = MemoryAgent(self.governed, self.encoder, get_backbone(backbone))

    @classmethod
    def init(
        cls,
        directory: str | Path,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        policy: list[ConsentRecord] | None = None,
        database_url: str | None = None,
        schema: str = "msm_mem",
    ) -> MsmMem:
        """Create a store in ``directory`` for the settings' encoder (default ``pixels``), a
        local key file, and the default consent policy (see governance.consent.default_policy).

        The store of record is embedded (SQLite in ``directory``) unless ``database_url``
        names a PostgreSQL server with pgvector: then it is a new store in ``schema`` there,
        and ``directory`` keeps the keys, the checkpoints and ``store.json`` (the URL without
        its password). When any step fails, what init made is removed again."""
        directory = Path(directory)
        settings = settings or Settings()
        server = None if database_url is None else ServerLocation(database_url, schema)
        encoder = get_encoder(settings.encoder)
        existed = directory.exists()
        store = create_store(directory, dim=encoder.dim, encoder=encoder.name, server=server)
        try:
            (directory / "keys").mkdir(mode=0o700, exist_ok=True)
            provider = LocalKeyFileProvider.create(directory / "keys" / "kek.json")
            mem = cls(directory, store, provider, settings, clock)
            consents = default_policy(mem.clock.now()) if policy is None else policy
            mem.grant(consents, ADMIN)
        except BaseException as exc:
            try:
                _remove_new_store(directory, existed, store)
            except Exception as cleanup:  # the first error is the one to report
                exc.add_note(f"and undoing init failed too, leaving parts of the store: {cleanup}")
            raise
        return mem

    @classmethod
    def open(
        cls,
        directory: str | Path,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        backbone: str = "nonparametric",
        database_url: str | None = None,
    ) -> MsmMem:
        """Open an existing store directory; its recorded encoder is used. ``database_url``
        replaces the one in ``store.json`` for this opening (a server store only)."""
        directory = Path(directory)
        store = open_store(directory, dsn=database_url)
        try:
            provider = LocalKeyFileProvider.open(directory / "keys" / "kek.json")
            settings = (settings or Settings()).with_(encoder=store.encoder_name)
            return cls(directory, store, provider, settings, clock, backbone)
        except BaseException:
            store.close()
            raise

    # data ----------------------------------------------------------------------------------

    def ingest(self, rows: list[ManifestRow], *, progress: bool = False) -> IngestReport:
        """Encode and store manifest rows as base memory; see :func:`ingest_rows`."""
        return ingest_rows(self.governed, self.encoder, rows, progress=progress)

    def ask(self, patient_id: str, image: Any, question: str, **options: Any) -> AgentAnswer:
        """Run the online loop for one query; see :meth:`MemoryAgent.ask`."""
        write_back = options.pop("write_back", True)
        flags = {k: options.pop(k) for k in ("use_sem", "use_epi", "use_vis") if k in options}
        unknown = sorted(set(options) - {"timestamp", "study_id", "visual_tag"})
        if unknown:
            raise InvalidInput(
                f"unknown ask option(s) {unknown}: use timestamp, study_id, visual_tag, "
                "write_back, use_sem, use_epi, use_vis"
            )
        return self.agent.ask(Query(patient_id, image, question, **options), write_back=write_back, **flags)

    def export_paper(self, out: str | Path) -> dict[str, int]:
        """Write the paper's layout (decrypted) into ``out``; audited as an export."""
        spec = self.audit.spec(
            actor=ADMIN.id,
            role=ADMIN.role,
            action="export",
            source_tier="ltm",
            target_tier="source",
            purpose="export",
            reason="paper layout",
        )
        counts = export_paper(self.store, out)
        self.audit.write(WriteBatch(), [spec])
        return counts

    def import_paper(self, src: str | Path) -> dict[str, int]:
        """Read the paper's layout from ``src`` into this (empty) store; the records and the
        audit event are written in one transaction."""
        batch = read_paper(self.store, src)
        spec = self.audit.spec(
            actor=ADMIN.id,
            role=ADMIN.role,
            action="import",
            source_tier="source",
            target_tier="ltm",
            purpose="operations",
            reason="paper layout",
        )
        self.audit.write(batch, [spec])
        return {"episodic": len(batch.episodes), "visual": len(batch.visuals), "semantic": len(batch.semantic)}

    # governance ----------------------------------------------------------------------------

    def grant(self, consents: list[ConsentRecord], actor: Actor = ADMIN) -> None:
        """Store consent records (audited, one event each); each is validated first."""
        for c in consents:
            check_record(c)
        specs = [
            self.audit.spec(
                actor=actor.id,
                role=actor.role,
                action="consent_grant",
                source_tier="source",
                target_tier="ltm",
                purpose=c.purpose,
                record_ids=[c.consent_id],
                patient=c.patient_id,
                consent_id=c.consent_id,
            )
            for c in consents
        ]
        self.audit.write(WriteBatch(consents=list(consents)), specs)

    def revoke(self, consent_id: str, actor: Actor = ADMIN) -> None:
        """Revoke a consent from now on (audited)."""
        spec = self.audit.spec(
            actor=actor.id,
            role=actor.role,
            action="consent_revoke",
            source_tier="source",
            target_tier="ltm",
            purpose="operations",
            record_ids=[consent_id],
            consent_id=consent_id,
        )
        self.audit.write(WriteBatch(revocations=[(consent_id, self.clock.now())]), [spec])

    def maintain(self) -> MaintenanceReport:
        """Expire STM, consolidate by age, decay LTM, checkpoint the audit chain."""
        return self.maintainer.run()

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> MsmMem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
