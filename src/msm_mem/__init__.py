"""msm-mem: a governed, multimodal memory for medical AI agents.

The public API is exactly what this module re-exports (``__all__``); everything else is private.
"""

from __future__ import annotations

import logging

from ._agent.agent import AgentAnswer, Evidence, MemoryAgent, Query
from ._agent.offline import IngestReport, ingest_rows
from ._agent.policy import HeuristicPolicy
from ._agent.router import FixedRouter, LearnedRouter, fit_router
from ._api.mem import MsmMem
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
from ._governance.crypto import EnvelopeCipher
from ._governance.keys import KeyProvider, LocalKeyFileProvider
from ._memory.fusion import FusedPrompt, fuse
from ._memory.gate import GateDecision, WriteBackGate
from ._memory.lexicon import Lexicon
from ._memory.maintenance import Maintainer, MaintenanceReport
from ._memory.msm import Interaction, Memory, WriteResult
from ._memory.retrieval import Retrieval
from ._memory.tiers import Actor, GovernedMemory
from ._records import EpisodicRecord, Hit, Impression, SemanticState, State, VisualRecord, unit_vector
from ._settings import Settings
from ._storage.base import FieldCodec, StateChange, Store, WriteBatch
from ._storage.paper_layout import export_paper, import_paper
from ._storage.sqlite import SqliteStore
from ._tier_records import AuditRow, Claim, ConsentRecord, StmItem, StmState
from .datasets.manifest import ManifestRow, RowProblem, read_manifest, write_manifest
from .plugins.backbones import Backbone, BackboneReply, BackboneRequest, get_backbone
from .plugins.encoders import Encoder, get_encoder

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AccessDenied",
    "Actor",
    "AgentAnswer",
    "AuditChainBroken",
    "AuditRow",
    "Backbone",
    "BackboneReply",
    "BackboneRequest",
    "BackendError",
    "CanonicalJSONError",
    "Claim",
    "Clock",
    "ConsentDenied",
    "ConsentRecord",
    "DecryptionError",
    "Encoder",
    "EncoderMismatch",
    "EnvelopeCipher",
    "EpisodicRecord",
    "Evidence",
    "FieldCodec",
    "FixedRouter",
    "FusedPrompt",
    "GateDecision",
    "GovernedMemory",
    "HeuristicPolicy",
    "Hit",
    "IllegalTransition",
    "ImageError",
    "Impression",
    "IngestReport",
    "IntegrityError",
    "Interaction",
    "InvalidInput",
    "InvalidVector",
    "KeyProvider",
    "LearnedRouter",
    "Lexicon",
    "LocalKeyFileProvider",
    "Maintainer",
    "MaintenanceReport",
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
    "StmItem",
    "StmState",
    "Store",
    "StoreError",
    "SystemClock",
    "VisualRecord",
    "WriteBackGate",
    "WriteBatch",
    "WriteResult",
    "export_paper",
    "fit_router",
    "fuse",
    "get_backbone",
    "get_encoder",
    "import_paper",
    "ingest_rows",
    "read_manifest",
    "unit_vector",
    "write_manifest",
]
