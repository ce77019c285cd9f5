"""The Python API: a governed memory store directory, the one door to patient data.

A store directory holds::

    msm-mem.sqlite            store of record (PHI fields envelope-encrypted), or
    store.json                where the PostgreSQL store of record is (see storage.location)
    index/                    FAISS caches of the embedded store (rebuildable)
    keys/kek.json             local key-encryption keys (mode 0600); use a KMS in production
    keys/checkpoint.key       Ed25519 key signing audit checkpoints (mode 0600), unless kept elsewhere
    audit/checkpoints.jsonl   the signed head of every commit of audit rows, unless kept elsewhere
    audit/checkpoints.head    the signed head of the latest commit (written before it commits)

The checkpoint key and the checkpoints can live outside the directory (``checkpoint_key``: a
path or a signing key object; ``checkpoints``: a folder or ``*.jsonl`` file), and each
checkpoint can also be published to a ``witness`` (a folder or file elsewhere) that
verification consults. Pass the same to :meth:`MsmMem.init` and every :meth:`MsmMem.open`.

Every operation takes the acting :class:`~msm_mem.Principal` (id, role, purpose). The role is
checked against :data:`~msm_mem._api.access.OPERATIONS`, every move against the transition
table, every patient against consent, and the audit event is written in the same transaction
as the change. The store, cipher, audit log and memory core are private to this object.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._agent.agent import MemoryAgent
from .._clock import Clock, SystemClock
from .._errors import EncoderMismatch, InvalidInput
from .._governance.audit.checkpoint_files import CheckpointPlace, load_signer
from .._governance.audit.checkpoint_signer import CheckpointSigner, SigningKey
from .._governance.audit.log import AuditLog
from .._governance.consent import default_policy
from .._governance.crypto import EnvelopeCipher
from .._governance.envelope_codec import EnvelopeCodec
from .._governance.keys import KeyProvider, LocalKeyFileProvider
from .._memory.maintenance import Maintainer
from .._memory.msm import Memory
from .._memory.tiers import GovernedMemory
from .._principal import Principal
from .._settings import Settings
from .._storage.base import Store
from .._storage.location import ServerLocation, create_store, is_store, open_store, remove_new_store
from .._tier_records import ConsentRecord
from ..plugins.backbones import Backbone, get_backbone
from ..plugins.encoders import Encoder, get_encoder
from .access import Operation, require
from .admin import _Admin
from .base import Core
from .care import _Care
from .context import _Context
from .delegate import Delegated
from .reads import _Reads
from .scope import _Scope
from .trail import _Trail

__all__ = ["MsmMem"]


def _remove_new_store(directory: Path, existed: bool, store: Store) -> None:
    """Undo a half-made ``init``: remove only what init created (a server store's tables too)."""
    remove_new_store(directory, store)
    for sub in ("keys", "audit", "index"):
        shutil.rmtree(directory / sub, ignore_errors=True)
    if not existed:
        shutil.rmtree(directory, ignore_errors=True)


def _backbone(backbone: str | Backbone, options: Mapping[str, Any] | None) -> Backbone:
    if isinstance(backbone, str):
        return get_backbone(backbone, **dict(options or {}))
    if options:
        raise InvalidInput("backbone_options go with a backbone name, not with a backbone object")
    if not callable(getattr(backbone, "generate", None)):
        raise InvalidInput(f"backbone must be a name or an object with generate(), got {type(backbone).__name__}")
    return backbone


def _encoder(encoder: str | Encoder, options: Mapping[str, Any] | None) -> Encoder:
    if isinstance(encoder, str):
        return get_encoder(encoder, **dict(options or {}))
    if options:
        raise InvalidInput("encoder_options go with an encoder name, not with an encoder object")
    if not callable(getattr(encoder, "encode", None)) or not isinstance(getattr(encoder, "dim", None), int):
        raise InvalidInput(f"encoder must be a name or an object with dim and encode(), got {type(encoder).__name__}")
    return encoder


class MsmMem:
    """One governed memory store: ingest, ask, context, record_answer, retrieve, observe,
    consolidate, feedback, reads,
    consent, keys, audit, maintenance, export and import, each called with a principal.

    Open with :meth:`init` (new directory) or :meth:`open`; close it (or use it as a context
    manager) so the vector caches are saved. The encoder and the backbone are given by name
    (with ``encoder_options`` / ``backbone_options``) or as objects; a misconfigured plugin is
    :class:`InvalidInput` (or :class:`MissingExtra` naming the extra to install).
    """

    # The operations live in groups, one object each over the same private core; each public
    # method below is the group's own (its signature and docstring), called on the group.
    ingest = Delegated("_care", _Care.ingest)
    ask = Delegated("_care", _Care.ask)
    ask_many = Delegated("_care", _Care.ask_many)
    retrieve = Delegated("_care", _Care.retrieve)
    observe = Delegated("_care", _Care.observe)
    consolidate = Delegated("_care", _Care.consolidate)
    feedback = Delegated("_care", _Care.feedback)

    context = Delegated("_context", _Context.context)
    record_answer = Delegated("_context", _Context.record_answer)

    semantic_state = Delegated("_reads", _Reads.semantic_state)
    semantic_history = Delegated("_reads", _Reads.semantic_history)
    episodes = Delegated("_reads", _Reads.episodes)
    visuals = Delegated("_reads", _Reads.visuals)
    claims = Delegated("_reads", _Reads.claims)
    claim_history = Delegated("_reads", _Reads.claim_history)
    stm_items = Delegated("_reads", _Reads.stm_items)

    grant = Delegated("_admin", _Admin.grant)
    revoke = Delegated("_admin", _Admin.revoke)
    consents = Delegated("_admin", _Admin.consents)
    rotate_keys = Delegated("_admin", _Admin.rotate_keys)
    shred = Delegated("_admin", _Admin.shred)
    verify_audit = Delegated("_admin", _Admin.verify_audit)
    checkpoint = Delegated("_admin", _Admin.checkpoint)
    export_fhir = Delegated("_admin", _Admin.export_fhir)
    maintain = Delegated("_admin", _Admin.maintain)
    export_paper = Delegated("_admin", _Admin.export_paper)
    import_paper = Delegated("_admin", _Admin.import_paper)

    audit_trail = Delegated("_trail", _Trail.audit_trail)

    refuse = Delegated("_scope", _Scope.refuse)
    break_glass = Delegated("_scope", _Scope.break_glass)
    refuse_login = Delegated("_scope", _Scope.refuse_login)

    def __init__(
        self,
        directory: Path,
        store: Store,
        provider: KeyProvider,
        settings: Settings,
        clock: Clock | None = None,
        *,
        backbone: str | Backbone = "nonparametric",
        backbone_options: Mapping[str, Any] | None = None,
        encoder: str | Encoder | None = None,
        encoder_options: Mapping[str, Any] | None = None,
        checkpoint_key: str | Path | SigningKey | None = None,
        checkpoints: str | Path | None = None,
        witness: str | Path | None = None,
    ) -> None:
        """Private: use :meth:`init` or :meth:`open`."""
        self._directory = directory
        self._settings = settings
        self._clock = clock or SystemClock()
        enc = _encoder(store.encoder_name if encoder is None else encoder, encoder_options)
        if enc.dim != store.dim or enc.name != store.encoder_name:
            raise EncoderMismatch(
                f"encoder {enc.name} ({enc.dim}-d) does not match the store's {store.encoder_name} ({store.dim}-d)"
            )
        chosen = _backbone(backbone, backbone_options)
        wants = getattr(chosen, "encoder_name", None)  # a fitted backbone reads images through its own encoder
        if isinstance(wants, str) and wants != enc.name:
            raise InvalidInput(f"backbone {chosen.name!r} was fitted on encoder {wants}; this store uses {enc.name}")
        self._encoder = enc
        self._store = store
        self._cipher = EnvelopeCipher(store.store_id, provider, store.keys(), self._clock.now)
        store.use_codec(EnvelopeCodec(self._cipher, store.keys()))
        signer = load_signer(directory, checkpoint_key)
        store.use_row_key(signer.row_key(store.store_id))
        self._cipher.use_tomb_key(signer.tomb_key(store.store_id))
        self._audit = AuditLog(
            store,
            self._cipher,
            directory,
            self._clock,
            signer=signer,
            place=CheckpointPlace.of(directory, checkpoints, witness),
        )
        self._gm = GovernedMemory(Memory(store, settings, self._clock), self._audit)
        self._agent = MemoryAgent(self._gm, enc, chosen, directory=directory)
        core = Core(directory, settings, self._clock, enc, store, self._cipher, self._audit, self._gm, self._agent)
        self._care = _Care(core)
        self._context = _Context(core)
        self._reads = _Reads(core)
        self._admin = _Admin(core)
        self._trail = _Trail(core)
        self._scope = _Scope(core)
        self._core = core

    def _maintainer(self, system: Principal | None = None, at: float | None = None) -> Maintainer:
        """The maintenance sweep over this memory, as :meth:`maintain` and :meth:`shred` run it."""
        return self._core.maintainer(system, at)

    @classmethod
    def init(
        cls,
        directory: str | Path,
        principal: Principal,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        policy: list[ConsentRecord] | None = None,
        population: bool = True,
        database_url: str | None = None,
        schema: str = "msm_mem",
        backbone: str | Backbone = "nonparametric",
        backbone_options: Mapping[str, Any] | None = None,
        encoder_options: Mapping[str, Any] | None = None,
        checkpoint_key: str | Path | SigningKey | None = None,
        checkpoints: str | Path | None = None,
        witness: str | Path | None = None,
    ) -> MsmMem:
        """Create a store in ``directory`` for the settings' encoder (default ``pixels``), a
        local key file, and the consent ``policy`` (default: governance.consent.default_policy,
        with population use permitted unless ``population`` is False), granted by ``principal``
        (an admin; audited).

        The store of record is embedded (SQLite in ``directory``) unless ``database_url``
        names a PostgreSQL server with pgvector: then it is a new store in ``schema`` there,
        and ``directory`` keeps the keys, the checkpoints and ``store.json`` (the URL without
        its password), of the settings' ``tenant``: other tenants may have stores in the same
        schema, each separate (docs/deploy.md). The checkpoint signing key is created at ``checkpoint_key`` (default
        ``DIR/keys/checkpoint.key``) unless that file exists, or is the signing key object given;
        ``checkpoints`` and ``witness`` say where checkpoints go (see the module docstring).
        When any step fails, what init made is removed again."""
        require(principal, Operation.INIT)
        directory = Path(directory)
        settings = settings or Settings()
        server = None if database_url is None else ServerLocation(database_url, schema, settings.tenant)
        encoder = get_encoder(settings.encoder, **dict(encoder_options or {}))
        existed = directory.exists()
        store = create_store(
            directory,
            dim=encoder.dim,
            encoder=encoder.name,
            server=server,
            population_search=settings.population_search,
            ef_search=settings.population_ef_search,
            tenant=settings.tenant,
        )
        try:
            (directory / "keys").mkdir(mode=0o700, exist_ok=True)
            provider = LocalKeyFileProvider.create(directory / "keys" / "kek.json")
            if checkpoint_key is None or isinstance(checkpoint_key, str | Path):
                key_path = directory / "keys" / "checkpoint.key" if checkpoint_key is None else Path(checkpoint_key)
                if not key_path.exists():
                    CheckpointSigner.create(key_path)
            mem = cls(
                directory,
                store,
                provider,
                settings,
                clock,
                backbone=backbone,
                backbone_options=backbone_options,
                encoder=encoder,
                checkpoint_key=checkpoint_key,
                checkpoints=checkpoints,
                witness=witness,
            )
            if policy is not None and not population:
                raise InvalidInput("population=False chooses the default policy: give it, or a policy, not both")
            consents = default_policy(mem._clock.now(), population=population) if policy is None else policy
            mem.grant(principal, consents)
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
        backbone: str | Backbone = "nonparametric",
        backbone_options: Mapping[str, Any] | None = None,
        encoder: Encoder | None = None,
        encoder_options: Mapping[str, Any] | None = None,
        database_url: str | None = None,
        tenant: str | None = None,
        checkpoint_key: str | Path | SigningKey | None = None,
        checkpoints: str | Path | None = None,
        witness: str | Path | None = None,
    ) -> MsmMem:
        """Open an existing store directory; its recorded encoder and tenant are used (``encoder``
        may pass an instance of it; ``tenant``, when given, must be the directory's, else
        InvalidInput). ``database_url`` replaces the one in ``store.json`` for this opening
        (a server store only). ``checkpoint_key``, ``checkpoints`` and ``witness`` as given to
        :meth:`init` (a missing key is :class:`~msm_mem.CheckpointKeyMissing`). Opening reads
        no patient data, so it takes no principal; every operation on the opened store does."""
        directory = Path(directory)
        settings = settings or Settings()
        store = open_store(
            directory,
            dsn=database_url,
            population_search=settings.population_search,
            ef_search=settings.population_ef_search,
            tenant=tenant,
        )
        try:
            provider = LocalKeyFileProvider.open(directory / "keys" / "kek.json")
            settings = settings.with_(encoder=store.encoder_name, tenant=store.tenant)
            return cls(
                directory,
                store,
                provider,
                settings,
                clock,
                backbone=backbone,
                backbone_options=backbone_options,
                encoder=encoder,
                encoder_options=encoder_options,
                checkpoint_key=checkpoint_key,
                checkpoints=checkpoints,
                witness=witness,
            )
        except BaseException:
            store.close()
            raise

    @classmethod
    def upgrade(
        cls,
        directory: str | Path,
        principal: Principal,
        *,
        database_url: str | None = None,
        tenant: str | None = None,
        checkpoint_key: str | Path | SigningKey | None = None,
        checkpoints: str | Path | None = None,
        witness: str | Path | None = None,
    ) -> dict[str, int]:
        """Upgrade a store written by an older msm-mem (store schema 1 or 2), as an admin,
        audited: every row gets the store's tenant (an embedded store's: ``tenant``, default
        "default"; a server store's: its ``store.json``'s, which ``tenant`` must match), its
        audit chain is checked and its unsigned head adopted, clear visual tags encrypted,
        row digests computed, in one transaction (a crash leaves the old store as it was; see
        :mod:`msm_mem._governance.upgrade`). :meth:`open` refuses such a store, naming this.
        Returns ``from_schema``, ``to_schema``, ``visual_tags_encrypted``, ``events_signed``."""
        p = require(principal, Operation.STORE_UPGRADE)
        directory = Path(directory)
        store = open_store(directory, dsn=database_url, upgrading=True, tenant=tenant)
        try:
            provider = LocalKeyFileProvider.open(directory / "keys" / "kek.json")
            settings = Settings().with_(encoder=store.encoder_name, tenant=store.tenant)
            mem = cls(
                directory,
                store,
                provider,
                settings,
                checkpoint_key=checkpoint_key,
                checkpoints=checkpoints,
                witness=witness,
            )
        except BaseException:
            store.close()
            raise
        with mem:
            return mem._admin._upgrade(p)

    @staticmethod
    def exists(directory: str | Path) -> bool:
        """Whether ``directory`` holds a memory store (embedded, or ``store.json`` naming a
        server store). Looks at file names only: it opens nothing and reads no patient data."""
        return is_store(Path(directory))

    # what the store is (no patient data) ---------------------------------------------------

    @property
    def directory(self) -> Path:
        """The store directory."""
        return self._directory

    @property
    def settings(self) -> Settings:
        """The memory settings in force (frozen)."""
        return self._settings

    @property
    def encoder_name(self) -> str:
        """The store's image encoder."""
        return self._store.encoder_name

    @property
    def dim(self) -> int:
        """The dimension of the store's embeddings."""
        return self._store.dim

    @property
    def tenant(self) -> str:
        """The store's tenant (the distribution column of every row; docs/deploy.md)."""
        return self._store.tenant

    @property
    def backbone_name(self) -> str:
        """The name of the backbone that answers :meth:`ask`."""
        return str(getattr(self._agent.backbone, "name", type(self._agent.backbone).__name__))

    def now(self) -> float:
        """The store's clock, UTC seconds."""
        return self._clock.now()

    def close(self) -> None:
        """Save the caches and close the store."""
        self._store.close()

    def __enter__(self) -> MsmMem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
