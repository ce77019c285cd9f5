"""msm-mem: a governed, multimodal memory for medical AI agents.

The public API is exactly what this module re-exports (``__all__``); everything else is private.
Patient data is reached only through :class:`MsmMem`, and every call names its
:class:`Principal` (who, role, purpose). The store, the cipher, the audit log and the memory core
are private; records handed out are immutable.
"""

from __future__ import annotations

import logging

from ._agent.agent import AgentAnswer, Evidence, Query
from ._agent.answer import ModelRef
from ._agent.offline import IngestReport
from ._agent.router import ExpertWeights, FixedRouter, LearnedRouter, fit_router
from ._api import MsmMem
from ._api.access import OPERATIONS, Operation
from ._api.care import Retrieved, RetrievedItem
from ._api.context import FusedContext, RecordedAnswer
from ._api.reads import RecordPage
from ._api.trail import AuditTrail
from ._client import AsyncMemoryClient, MemoryClient
from ._clock import Clock, FixedClock, SystemClock
from ._errors import (
    AccessDenied,
    AuditChainBroken,
    BackendError,
    BackendUnavailable,
    CanonicalJSONError,
    CheckpointKeyMissing,
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
    WriteConflict,
)
from ._governance.audit.checkpoint import Checkpoint
from ._governance.audit.erasure import ErasureReceipt
from ._governance.audit.event import AuditEvent
from ._governance.audit.verify import VerifyResult
from ._memory.claim_evidence import claim_key
from ._memory.gate import GateDecision
from ._memory.maintenance import DecayPlan, MaintenanceReport
from ._memory.msm import WriteResult
from ._principal import Principal, Purpose, Role
from ._records import (
    EpisodicRecord,
    Hit,
    Impression,
    ManifestRow,
    RowProblem,
    SemanticState,
    State,
    VisualRecord,
    unit_vector,
)
from ._settings import Settings
from ._tier_records import Claim, ConsentRecord, StmItem, StmPayload, StmState
from .datasets.manifest import read_manifest, write_manifest
from .plugins.backbones import Backbone, BackboneReply, BackboneRequest, get_backbone
from .plugins.encoders import Encoder, get_encoder

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AccessDenied",
    "AgentAnswer",
    "AsyncMemoryClient",
    "AuditChainBroken",
    "AuditEvent",
    "AuditTrail",
    "Backbone",
    "BackboneReply",
    "BackboneRequest",
    "BackendError",
    "BackendUnavailable",
    "CanonicalJSONError",
    "Checkpoint",
    "CheckpointKeyMissing",
    "Claim",
    "Clock",
    "ConsentDenied",
    "ConsentRecord",
    "DecayPlan",
    "DecryptionError",
    "Encoder",
    "EncoderMismatch",
    "EpisodicRecord",
    "ErasureReceipt",
    "Evidence",
    "ExpertWeights",
    "FixedClock",
    "FixedRouter",
    "FusedContext",
    "GateDecision",
    "Hit",
    "IllegalTransition",
    "ImageError",
    "Impression",
    "IngestReport",
    "IntegrityError",
    "InvalidInput",
    "InvalidVector",
    "LearnedRouter",
    "MaintenanceReport",
    "ManifestError",
    "ManifestRow",
    "MemoryClient",
    "MissingExtra",
    "ModelRef",
    "MsmMem",
    "MsmMemError",
    "NotFound",
    "OPERATIONS",
    "Operation",
    "Principal",
    "Purpose",
    "Query",
    "RecordPage",
    "RecordedAnswer",
    "Retrieved",
    "RetrievedItem",
    "Role",
    "RowProblem",
    "SemanticState",
    "Settings",
    "State",
    "StmItem",
    "StmPayload",
    "StmState",
    "StoreError",
    "SystemClock",
    "VerifyResult",
    "VisualRecord",
    "WriteConflict",
    "WriteResult",
    "claim_key",
    "fit_router",
    "get_backbone",
    "get_encoder",
    "read_manifest",
    "unit_vector",
    "write_manifest",
]
