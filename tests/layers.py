"""The layers under :class:`~msm_mem.MsmMem`, each built through its own constructor from a memory
directory, the way ``MsmMem.__init__`` builds them: the store of record, the envelope cipher,
the audit log, the governed memory tiers, the agent and the maintainer.

A test of one layer builds it here, not through a private attribute of an ``MsmMem``. A store
made with ``MsmMem.init`` (the test admin's, with its keys and consent policy) may stay open
beside these layers: they are another handle on the same store, as another worker's would be.
Such a handle sees the other's commits at the start of its next governed turn; the ``store``
of :class:`Layers` sees them at every call (it calls ``Store.sync`` first), so what a test
reads there is what is committed, never what this handle cached before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from msm_mem._agent.agent import MemoryAgent
from msm_mem._api.mem import _open_keys
from msm_mem._clock import Clock, SystemClock
from msm_mem._governance.audit.checkpoint_files import CheckpointPlace
from msm_mem._governance.audit.checkpoint_signer import CheckpointSigner, SigningKey
from msm_mem._governance.audit.log import AuditLog
from msm_mem._governance.crypto import EnvelopeCipher
from msm_mem._governance.envelope_codec import EnvelopeCodec
from msm_mem._governance.keys import KeyProvider
from msm_mem._memory.maintenance import Maintainer
from msm_mem._memory.msm import Memory
from msm_mem._memory.tiers import GovernedMemory
from msm_mem._principal import Principal
from msm_mem._settings import Settings
from msm_mem._storage.base import Store
from msm_mem._storage.location import open_store
from msm_mem.plugins.backbones import Backbone, get_backbone
from msm_mem.plugins.encoders import Encoder, get_encoder


def store_keys(
    directory: Path,
    store: Store,
    *,
    key_home: str | Path | None = None,
    key_provider: KeyProvider | None = None,
    checkpoint_key: str | Path | SigningKey | None = None,
    checkpoints: str | Path | None = None,
    witness: str | Path | None = None,
) -> tuple[KeyProvider, CheckpointSigner, CheckpointPlace]:
    """The key provider, the checkpoint signer and the checkpoint place of the memory at
    ``directory``, found as ``MsmMem.open`` finds them (the key home, a master key in the
    environment, or the KMS and signing key given). The one place in the tests that knows
    where a store's keys live."""
    return _open_keys(directory, store, key_home, key_provider, checkpoint_key, checkpoints, witness)


class _Synced:
    """A store handle whose every method first sees what other handles committed (``sync``)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found) or name in ("sync", "close"):
            return found

        def synced(*args: Any, **kwargs: Any) -> Any:
            self._store.sync()
            return found(*args, **kwargs)

        return synced


@dataclass
class Layers:
    """The parts of one open memory, outside any ``MsmMem``; close it (or use it as a context
    manager) to close its store handle."""

    directory: Path
    #: the store handle the other layers share, behind the view that syncs at every call
    handle: Store
    #: the key provider the cipher wraps data keys with
    keys: KeyProvider
    settings: Settings
    clock: Clock
    encoder: Encoder
    cipher: EnvelopeCipher
    audit: AuditLog
    gm: GovernedMemory
    agent: MemoryAgent

    @property
    def store(self) -> Store:
        """The store handle, seeing other handles' commits (an ``MsmMem`` beside it) at every call."""
        return cast(Store, _Synced(self.handle))

    def maintainer(self, system: Principal | None = None, at: float | None = None) -> Maintainer:
        """The maintenance sweep over these layers, configured from the settings as ``maintain`` does."""
        options: dict[str, Any] = {
            "consolidate_after_s": self.settings.consolidate_after_s,
            "at": at,
            "retention_s": self.settings.retention_s,
        }
        if system is not None:
            options["system"] = system
        return Maintainer(self.gm, self.cipher, **options)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> Layers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_layers(
    directory: str | Path,
    *,
    clock: Clock | None = None,
    settings: Settings | None = None,
    backbone: str | Backbone = "nonparametric",
    encoder: Encoder | None = None,
    key_home: str | Path | None = None,
    key_provider: KeyProvider | None = None,
    checkpoint_key: str | Path | SigningKey | None = None,
    checkpoints: str | Path | None = None,
    witness: str | Path | None = None,
) -> Layers:
    """The layers of the memory at ``directory`` (made by ``MsmMem.init``), each through its own
    constructor (``settings``, default ``Settings()``, take the store's encoder and tenant); give
    the clock and settings of the ``MsmMem`` beside them so both handles agree on time and
    thresholds."""
    directory = Path(directory)
    clock = clock or SystemClock()
    settings = settings or Settings()
    store = open_store(directory, population_search=settings.population_search, ef_search=settings.population_ef_search)
    try:
        settings = settings.with_(encoder=store.encoder_name, tenant=store.tenant)
        enc = encoder if encoder is not None else get_encoder(store.encoder_name)
        provider, signer, place = store_keys(
            directory,
            store,
            key_home=key_home,
            key_provider=key_provider,
            checkpoint_key=checkpoint_key,
            checkpoints=checkpoints,
            witness=witness,
        )
        cipher = EnvelopeCipher(store.store_id, provider, store.keys(), clock.now)
        store.use_codec(EnvelopeCodec(cipher, store.keys()))
        store.use_row_key(signer.row_key(store.store_id))
        cipher.use_tomb_key(signer.tomb_key(store.store_id))
        audit = AuditLog(store, cipher, directory, clock, signer=signer, place=place)
        gm = GovernedMemory(Memory(store, settings, clock), audit)
        chosen = get_backbone(backbone) if isinstance(backbone, str) else backbone
        agent = MemoryAgent(gm, enc, chosen, directory=directory)
    except BaseException:
        store.close()
        raise
    return Layers(directory, store, provider, settings, clock, enc, cipher, audit, gm, agent)


def layers_of(mem: Any, clock: Clock | None = None, **options: Any) -> Layers:
    """:func:`open_layers` on the directory of the open ``MsmMem`` ``mem``, with its settings
    (public properties only) and ``clock`` (give the one ``mem`` was made with)."""
    return open_layers(mem.directory, clock=clock, settings=mem.settings, **options)


class Views:
    """The layers of open ``MsmMem`` stores, opened on first use (one per directory) with their
    settings and closed together: ``views(mem).store.count("episodic")`` reads what ``mem``
    committed through a handle of its own. A test module's fixture yields one."""

    def __init__(self) -> None:
        self._opened: dict[Path, Layers] = {}

    def __call__(self, mem: Any, clock: Clock | None = None) -> Layers:
        found = self._opened.get(Path(mem.directory))
        if found is None:
            found = self._opened[Path(mem.directory)] = layers_of(mem, clock)
        return found

    def close(self) -> None:
        for layers in self._opened.values():
            layers.close()
        self._opened.clear()

    def __enter__(self) -> Views:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
