"""msm-mem: a governed, multimodal memory for medical AI agents.

The public API is exactly what this module re-exports (``__all__``); everything else is private.
"""

from __future__ import annotations

import logging

from ._clock import Clock, SystemClock
from ._errors import (
    AccessDenied,
    AuditChainBroken,
    BackendError,
    CanonicalJSONError,
    ConsentDenied,
    DecryptionError,
    EncoderMismatch,
    IllegalTransition,
    ImageError,
    IntegrityError,
    InvalidInput,
    InvalidVector,
    ManifestError,
    MissingExtra,
    MsmMemError,
    NotFound,
    StoreError,
)
from ._records import EpisodicRecord, Hit, Impression, SemanticState, State, VisualRecord, unit_vector
from ._settings import Settings
from .agent.agent import AgentAnswer, Evidence, MemoryAgent, Query
from .agent.offline import IngestReport, ingest_rows
from .datasets.manifest import ManifestRow, RowProblem, read_manifest, write_manifest
from .interfaces.api import MsmMem
from .memory.fusion import FusedPrompt, fuse
from .memory.gate import GateDecision, WriteBackGate
from .memory.lexicon import Lexicon
from .memory.msm import Interaction, Memory, WriteResult
from .memory.retrieval import Retrieval
from .plugins.backbones import Backbone, BackboneReply, BackboneRequest, get_backbone
from .plugins.encoders import Encoder, get_encoder
from .storage.base import FieldCodec, StateChange, Store, WriteBatch
from .storage.paper_layout import export_paper, import_paper
from .storage.sqlite import SqliteStore

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AccessDenied",
    "AgentAnswer",
    "AuditChainBroken",
    "Backbone",
    "BackboneReply",
    "BackboneRequest",
    "BackendError",
    "CanonicalJSONError",
    "Clock",
    "ConsentDenied",
    "DecryptionError",
    "Encoder",
    "EncoderMismatch",
    "EpisodicRecord",
    "Evidence",
    "FieldCodec",
    "FusedPrompt",
    "GateDecision",
    "Hit",
    "IllegalTransition",
    "ImageError",
    "Impression",
    "IngestReport",
    "IntegrityError",
    "Interaction",
    "InvalidInput",
    "InvalidVector",
    "Lexicon",
    "ManifestError",
    "ManifestRow",
    "Memory",
    "MemoryAgent",
    "MissingExtra",
    "MsmMem",
    "MsmMemError",
    "NotFound",
    "Query",
    "Retrieval",
    "RowProblem",
    "SemanticState",
    "Settings",
    "SqliteStore",
    "State",
    "StateChange",
    "Store",
    "StoreError",
    "SystemClock",
    "VisualRecord",
    "WriteBackGate",
    "WriteBatch",
    "WriteResult",
    "export_paper",
    "fuse",
    "get_backbone",
    "get_encoder",
    "import_paper",
    "ingest_rows",
    "read_manifest",
    "unit_vector",
    "write_manifest",
]
