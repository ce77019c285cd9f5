"""Tests of the public surface: ``msm_mem.__all__`` is pinned, sorted and resolvable."""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
from pathlib import Path

import msm_mem

# Changing the public API is a decision: update this list in the same change, on purpose.
PUBLIC = [
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


def test_all_is_exactly_the_pinned_list() -> None:
    """msm_mem.__all__ equals the pinned list: nothing added or removed by accident."""
    assert msm_mem.__all__ == PUBLIC


def test_all_is_sorted_without_duplicates() -> None:
    """__all__ is kept in sorted order with no name twice."""
    assert msm_mem.__all__ == sorted(set(msm_mem.__all__))


def test_every_public_name_resolves() -> None:
    """Each name in __all__ is an attribute of the package, and star-import binds them all."""
    for name in msm_mem.__all__:
        assert getattr(msm_mem, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from msm_mem import *", namespace)
    assert set(PUBLIC) <= set(namespace)


def test_every_public_name_is_documented() -> None:
    """Each public class and function has a docstring (its help text)."""
    undocumented = [n for n in PUBLIC if not inspect.getdoc(getattr(msm_mem, n))]
    assert undocumented == []


def test_public_objects_live_in_private_or_layer_modules() -> None:
    """Re-exported objects come from msm_mem's own modules, not from third-party packages."""
    for name in PUBLIC:
        module = getattr(getattr(msm_mem, name), "__module__", "msm_mem") or "msm_mem"
        assert module.startswith("msm_mem"), (name, module)


def test_version_matches_the_distribution() -> None:
    """msm_mem.__version__ is the installed distribution's version."""
    assert msm_mem.__version__ == importlib.metadata.version("msm-mem")


def test_package_is_typed() -> None:
    """The package ships py.typed so type checkers use its annotations."""
    assert (Path(msm_mem.__file__).parent / "py.typed").is_file()


def test_library_logger_has_a_null_handler() -> None:
    """The library logger has a NullHandler, so an application without logging set sees nothing."""
    handlers = logging.getLogger("msm_mem").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_importing_the_package_does_not_import_optional_extras() -> None:
    """Importing msm_mem loads no torch or HTTP server (plugins are imported lazily)."""
    import subprocess
    import sys

    code = (
        "import sys, msm_mem; print(','.join(m for m in ('torch', 'open_clip', 'torchxrayvision') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(Path(msm_mem.__file__).parents[1])},
    )
    assert out.stdout.strip() == ""
