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
from ._tier_records import AuditRow, Claim, ConsentRecord, StmItem, StmState
from .agent.agent import AgentAnswer, Evidence, MemoryAgent, Query
from .agent.offline import IngestReport, ingest_rows
from .agent.policy import HeuristicPolicy
from .agent.router import FixedRouter, LearnedRouter, fit_router
from .datasets.manifest import ManifestRow, RowProblem, read_manifest, write_manifest
from .governance.crypto import EnvelopeCipher
from .governance.keys import KeyProvider, LocalKeyFileProvider
from .interfaces.api import MsmMem
from .memory.fusion import FusedPrompt, fuse
from .memory.gate import GateDecision, WriteBackGate
from .memory.lexicon import Lexicon
from .memory.maintenance import Maintainer, MaintenanceReport
from .memory.msm import Interaction, Memory, WriteResult
from .memory.retrieval import Retrieval
from .memory.tiers import Actor, GovernedMemory
from .plugins.backbones import Backbone, BackboneReply, BackboneRequest, get_backbone
from .plugins.encoders import Encoder, get_encoder
from .storage.base import FieldCodec, StateChange, Store, WriteBatch
from .storage.paper_layout import export_paper, import_paper
from .storage.sqlite import SqliteStore

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
