"""The Python API: a governed memory store directory, the one door to patient data.

A store directory holds::

    msm-mem.sqlite            store of record (PHI fields envelope-encrypted), or
    store.json                where the PostgreSQL store of record is (see storage.location)
    index/                    FAISS caches of the embedded store (rebuildable)
    audit/checkpoints.jsonl   the signed head of every commit of audit rows, unless kept elsewhere
    audit/checkpoints.head    the signed head of the latest commit (written before it commits)

The keys are not in the directory: a copy of it alone can neither decrypt nor re-sign. They
come from the key home (``key_home``, default ``MSM_MEM_KEY_HOME`` or the user's configuration
folder), a master key in the environment (``MSM_MEM_MASTER_KEY``) or a KMS (``key_provider``
and ``checkpoint_key``); see :mod:`msm_mem._governance.key_home`. The key home also keeps the
store's record (its schema and witness) and, unless ``witness`` names another, the witness every
checkpoint is published to, which verification requires to be up to date. The checkpoints can
live outside the directory too (``checkpoints``: a folder or ``*.jsonl`` file). Pass the same
to :meth:`MsmMem.init` and every :meth:`MsmMem.open`.

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
from .._errors import EncoderMismatch, InvalidInput, StoreError
from .._governance.audit.checkpoint_files import CheckpointPlace, log_file
from .._governance.audit.checkpoint_signer import CheckpointSigner, SigningKey
from .._governance.audit.log import AuditLog
from .._governance.consent import default_policy
from .._governance.crypto import EnvelopeCipher
from .._governance.envelope_codec import EnvelopeCodec
from .._governance.key_home import KeyHome, StoreRecord, master_key_from_env
from .._governance.keys import KeyProvider
from .._memory.maintenance import Maintainer
from .._memory.msm import Memory
from .._memory.tiers import GovernedMemory
from .._principal import Principal
from .._settings import Settings
from .._storage.base import Store
from .._storage.location import (
    ServerLocation,
    create_store,
    is_store,
    open_store,
    remove_new_store,
    store_id_of,
)
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


def _remove_new_store(directory: Path, existed: bool, store: Store, home: KeyHome | None) -> None:
    """Undo a half-made ``init``: remove only what init created (a server store's tables too,
    and the store's folder in the key home, which init made for this new store id)."""
    remove_new_store(directory, store)
    for sub in ("keys", "audit", "index"):
        shutil.rmtree(directory / sub, ignore_errors=True)
    if not existed:
        shutil.rmtree(directory, ignore_errors=True)
    if home is not None:
        shutil.rmtree(home.folder, ignore_errors=True)


def _keys_in(directory: Path) -> list[Path]:
    """Key files an older msm-mem kept inside the store directory."""
    return [p for p in (directory / "keys" / "kek.json", directory / "keys" / "checkpoint.key") if p.exists()]


def _signing_key(directory: Path, key: str | Path | SigningKey | None, *, create: bool) -> CheckpointSigner | None:
    """The checkpoint signer of ``key``: None (the key home's), a signing key object, or a PEM
    file outside ``directory`` (created at init when absent)."""
    if key is None:
        return None
    if not isinstance(key, str | Path):
        return CheckpointSigner(key)
    path = Path(key)
    if path.resolve().is_relative_to(directory.resolve()):
        raise InvalidInput(f"the checkpoint key {path} lies in the store directory: keep it outside (key home, KMS)")
    if create and not path.exists():
        return CheckpointSigner.create(path)
    return CheckpointSigner.load(path)


def _witness(directory: Path, home: KeyHome, given: str | Path | None, record: StoreRecord | None) -> Path:
    """The witness log: the one given (which must be the recorded one), else the recorded one,
    else the key home's default; never inside the store directory."""
    if given is not None:
        path = log_file(Path(given))
    else:
        path = record.witness if record is not None else home.default_witness
    if record is not None and path.resolve() != record.witness.resolve():
        raise InvalidInput(f"the store's witness is {record.witness} (recorded at init), not {path}")
    if path.resolve().is_relative_to(directory.resolve()):
        raise InvalidInput(f"the witness {path} lies in the store directory: it must be a second place")
    return path


def _open_keys(
    directory: Path,
    store: Store,
    key_home: str | Path | None,
    key_provider: KeyProvider | None,
    checkpoint_key: str | Path | SigningKey | None,
    checkpoints: str | Path | None,
    witness: str | Path | None,
    *,
    upgrading: bool = False,
) -> tuple[KeyProvider, CheckpointSigner, CheckpointPlace]:
    """The key provider, the signer and the checkpoint place of an existing store."""
    inside = _keys_in(directory)
    if inside:
        raise StoreError(
            f"{directory} keeps its keys inside the store directory ({', '.join(p.name for p in inside)}), where a"
            " copy of the directory holds them: move them to the key home once, as an admin (audited):"
            " msm-mem store upgrade DIR (MsmMem.upgrade)"
        )
    home = KeyHome(key_home, store.store_id, directory)
    record = home.read_record()
    if not upgrading:
        home.check_schema(store.schema_version, record)
    signer = _signing_key(directory, checkpoint_key, create=False)
    master = master_key_from_env()
    home.check_source(record, key_provider, master)
    provider, signer = home.open_keys(key_provider, signer, master)
    witness_log = _witness(directory, home, witness, record)
    log = log_file(Path(checkpoints) if checkpoints is not None else directory / "audit")
    return provider, signer, CheckpointPlace(log, witness_log)


def _refuse_set_back(directory: Path, dsn: str | None, tenant: str | None, key_home: str | Path | None) -> None:
    """After a store failed to open: AuditChainBroken when it opens as an older schema than its
    key home recorded (its schema was set back), else nothing (the first error stands)."""
    try:
        store = open_store(directory, dsn=dsn, upgrading=True, tenant=tenant)
    except Exception:
        return
    try:
        home = KeyHome(key_home, store.store_id, directory)
        home.check_schema(store.schema_version, home.read_record())
    except (InvalidInput, StoreError):
        return
    finally:
        store.close()


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
        signer: CheckpointSigner,
        place: CheckpointPlace,
        settings: Settings,
        clock: Clock | None = None,
        *,
        backbone: str | Backbone = "nonparametric",
        backbone_options: Mapping[str, Any] | None = None,
        encoder: str | Encoder | None = None,
        encoder_options: Mapping[str, Any] | None = None,
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
        store.use_row_key(signer.row_key(store.store_id))
        self._cipher.use_tomb_key(signer.tomb_key(store.store_id))
        self._audit = AuditLog(store, self._cipher, directory, self._clock, signer=signer, place=place)
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
        key_home: str | Path | None = None,
        key_provider: KeyProvider | None = None,
        checkpoint_key: str | Path | SigningKey | None = None,
        checkpoints: str | Path | None = None,
        witness: str | Path | None = None,
        audit_chains: int = 1,
    ) -> MsmMem:
        """Create a store in ``directory`` for the settings' encoder (default ``pixels``), its
        keys outside it, and the consent ``policy`` (default: governance.consent.default_policy,
        with population use permitted unless ``population`` is False), granted by ``principal``
        (an admin; audited).

        The store of record is embedded (SQLite in ``directory``) unless ``database_url``
        names a PostgreSQL server with pgvector: then it is a new store in ``schema`` there,
        and ``directory`` keeps the checkpoints and ``store.json`` (the URL without its
        password), of the settings' ``tenant``: other tenants may have stores in the same
        schema, each separate (docs/deploy.md). The keys: a ``key_provider`` (a KMS) and a
        ``checkpoint_key`` (a signing key object, or a PEM file outside the directory, created
        when absent) when given, else derived from ``MSM_MEM_MASTER_KEY``, else new key files
        in the store's folder of the key home (``key_home``, default ``MSM_MEM_KEY_HOME`` or
        the user's configuration folder), which also records the store's schema and witness
        (``witness``, default a file in that folder). ``audit_chains`` (1 to 256, a PostgreSQL
        store only) cuts the patients into that many lanes, each with its own write lock, audit
        chain and row digests, so writers of patients in different lanes do not queue on one
        another (docs/deploy.md); fixed for the store's life. When any step fails, what init
        made is removed again."""
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
            lanes=audit_chains,
        )
        home: KeyHome | None = None
        try:
            candidate = KeyHome(key_home, store.store_id, directory)
            if candidate.folder.exists():
                raise StoreError(f"the key home already has a folder for store {store.store_id}: {candidate.folder}")
            home = candidate
            signer = _signing_key(directory, checkpoint_key, create=True)
            master = master_key_from_env()
            source = home.source(key_provider, master)
            provider, signer = home.create_keys(key_provider, signer, master)
            witness_log = _witness(directory, home, witness, None)
            home.write_record(StoreRecord(store.store_id, store.schema_version, witness_log, source))
            log = log_file(Path(checkpoints) if checkpoints is not None else directory / "audit")
            place = CheckpointPlace(log, witness_log)
            mem = cls(
                directory,
                store,
                provider,
                signer,
                place,
                settings,
                clock,
                backbone=backbone,
                backbone_options=backbone_options,
                encoder=encoder,
            )
            if policy is not None and not population:
                raise InvalidInput("population=False chooses the default policy: give it, or a policy, not both")
            consents = default_policy(mem._clock.now(), population=population) if policy is None else policy
            mem.grant(principal, consents)
        except BaseException as exc:
            try:
                _remove_new_store(directory, existed, store, home)
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
        key_home: str | Path | None = None,
        key_provider: KeyProvider | None = None,
        checkpoint_key: str | Path | SigningKey | None = None,
        checkpoints: str | Path | None = None,
        witness: str | Path | None = None,
    ) -> MsmMem:
        """Open an existing store directory; its recorded encoder and tenant are used (``encoder``
        may pass an instance of it; ``tenant``, when given, must be the directory's, else
        InvalidInput). ``database_url`` replaces the one in ``store.json`` for this opening
        (a server store only). The keys and places as given to :meth:`init` (a missing key is
        named with where it was looked for). A store whose keys are still inside its directory
        (made by an older msm-mem) is refused, naming ``msm-mem store upgrade``; one whose
        schema is older than its key home recorded is :class:`AuditChainBroken`. Opening reads
        no patient data, so it takes no principal; every operation on the opened store does."""
        directory = Path(directory)
        settings = settings or Settings()
        try:
            store = open_store(
                directory,
                dsn=database_url,
                population_search=settings.population_search,
                ef_search=settings.population_ef_search,
                tenant=tenant,
            )
        except StoreError:
            _refuse_set_back(directory, database_url, tenant, key_home)
            raise
        try:
            provider, signer, place = _open_keys(
                directory, store, key_home, key_provider, checkpoint_key, checkpoints, witness
            )
            settings = settings.with_(encoder=store.encoder_name, tenant=store.tenant)
            return cls(
                directory,
                store,
                provider,
                signer,
                place,
                settings,
                clock,
                backbone=backbone,
                backbone_options=backbone_options,
                encoder=encoder,
                encoder_options=encoder_options,
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
        key_home: str | Path | None = None,
        key_provider: KeyProvider | None = None,
        checkpoint_key: str | Path | SigningKey | None = None,
        checkpoints: str | Path | None = None,
        witness: str | Path | None = None,
    ) -> dict[str, int]:
        """Upgrade a store written by an older msm-mem, as an admin, audited.

        Keys kept inside the directory (``DIR/keys/kek.json``, ``DIR/keys/checkpoint.key``)
        move to the store's folder of the key home (copied, loaded back, then removed from the
        directory), which then records the store and its witness. A store of schema 1 or 2
        also gets: every row the store's tenant (an embedded store's: ``tenant``, default
        "default"; a server store's: its ``store.json``'s, which ``tenant`` must match), its
        audit chain checked and its unsigned head adopted, clear visual tags encrypted, row
        digests computed, in one transaction (a crash leaves the old store as it was; see
        :mod:`msm_mem._governance.upgrade`). :meth:`open` refuses such a store, naming this.
        A store whose schema is older than its key home recorded is refused
        (:class:`AuditChainBroken`): adopting its head would adopt rewritten history.
        Returns ``from_schema``, ``to_schema``, ``visual_tags_encrypted``, ``events_signed``
        and ``keys_moved``."""
        p = require(principal, Operation.STORE_UPGRADE)
        directory = Path(directory)
        store = open_store(directory, dsn=database_url, upgrading=True, tenant=tenant)
        try:
            home = KeyHome(key_home, store.store_id, directory)
            home.check_schema(store.schema_version, home.read_record())
            moved = home.adopt(directory / "keys") if _keys_in(directory) else []
            provider, signer, place = _open_keys(
                directory, store, key_home, key_provider, checkpoint_key, checkpoints, witness, upgrading=True
            )
            settings = Settings().with_(encoder=store.encoder_name, tenant=store.tenant)
            mem = cls(directory, store, provider, signer, place, settings)
        except BaseException:
            store.close()
            raise
        with mem:
            out = mem._admin._upgrade(p, keys_moved=len(moved))
            source = home.source(key_provider, master_key_from_env())
            witness_log = place.witness or home.default_witness
            home.write_record(StoreRecord(store.store_id, store.schema_version, witness_log, source))
            return out

    @staticmethod
    def key_folder(
        directory: str | Path,
        *,
        key_home: str | Path | None = None,
        database_url: str | None = None,
        tenant: str | None = None,
    ) -> Path:
        """The store's folder in the key home (``key_home``, default ``MSM_MEM_KEY_HOME`` or the
        user's configuration folder): where its key files, record and default witness are,
        and where the CLI keeps the admin credential. Reads the store's id only."""
        directory = Path(directory)
        return KeyHome(key_home, store_id_of(directory, dsn=database_url, tenant=tenant), directory).folder

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
