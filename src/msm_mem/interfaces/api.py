"""The Python API: a store directory opened with its encoder, memory and agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._clock import Clock
from .._errors import EncoderMismatch
from .._settings import Settings
from ..agent.agent import AgentAnswer, MemoryAgent, Query
from ..agent.offline import IngestReport, ingest_rows
from ..datasets.manifest import ManifestRow
from ..memory.msm import Memory
from ..plugins.backbones import get_backbone
from ..plugins.encoders import get_encoder
from ..storage.paper_layout import export_paper, import_paper
from ..storage.sqlite import SqliteStore

__all__ = ["MsmMem"]


class MsmMem:
    """One memory store directory, ready to ingest, ask, export and import.

    Open with :meth:`init` (new directory) or :meth:`open` (existing); close it (or use it as a
    context manager) so the vector caches are saved.
    """

    def __init__(self, store: SqliteStore, settings: Settings, clock: Clock | None = None,
                 backbone: str = "nonparametric") -> None:  # fmt: skip
        self.store = store
        self.settings = settings
        self.encoder = get_encoder(store.encoder_name)
        if self.encoder.dim != store.dim:
            raise EncoderMismatch(f"encoder {store.encoder_name} is {self.encoder.dim}-d; the store is {store.dim}-d")
        self.memory = Memory(store, settings, clock)
        self.agent = MemoryAgent(self.memory, self.encoder, get_backbone(backbone))

    @classmethod
    def init(cls, directory: str | Path, *, settings: Settings | None = None, clock: Clock | None = None) -> MsmMem:
        """Create a store in ``directory`` for the settings' encoder (default ``pixels``)."""
        settings = settings or Settings()
        encoder = get_encoder(settings.encoder)
        store = SqliteStore.create(directory, dim=encoder.dim, encoder=encoder.name)
        return cls(store, settings, clock)

    @classmethod
    def open(cls, directory: str | Path, *, settings: Settings | None = None, clock: Clock | None = None,
             backbone: str = "nonparametric") -> MsmMem:  # fmt: skip
        """Open an existing store directory; its recorded encoder is used."""
        store = SqliteStore.open(directory)
        settings = (settings or Settings()).with_(encoder=store.encoder_name)
        return cls(store, settings, clock, backbone)

    def ingest(self, rows: list[ManifestRow], *, progress: bool = False) -> IngestReport:
        """Encode and store manifest rows (base memory); see :func:`ingest_rows`."""
        return ingest_rows(self.memory, self.encoder, rows, progress=progress)

    def ask(self, patient_id: str, image: Any, question: str, **options: Any) -> AgentAnswer:
        """Run the online loop for one query; see :meth:`MemoryAgent.ask`."""
        write_back = options.pop("write_back", True)
        flags = {k: options.pop(k) for k in ("use_sem", "use_epi", "use_vis") if k in options}
        return self.agent.ask(Query(patient_id, image, question, **options), write_back=write_back, **flags)

    def export_paper(self, out: str | Path) -> dict[str, int]:
        """Write the paper's layout into ``out``."""
        return export_paper(self.store, out)

    def import_paper(self, src: str | Path) -> dict[str, int]:
        """Read the paper's layout from ``src`` into this (empty) store."""
        return import_paper(self.store, src)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> MsmMem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
