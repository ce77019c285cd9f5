"""Small helpers shared by the test modules (images on disk, audit events of a store)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from msm_mem import Principal, Purpose, Role
from msm_mem._governance.audit_event import AuditEvent
from msm_mem._storage.base import Store


def png(folder: Path, seed: int, size: int = 64) -> Path:
    """A random grayscale PNG (one per seed, so the novelty gate sees different images)."""
    path = folder / f"img{seed}.png"
    if not path.exists():
        rng = np.random.default_rng(seed)
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), mode="L").save(path)
    return path


def audit_events(store: Store) -> list[AuditEvent]:
    """Every stored audit event, parsed and hash-checked."""
    return [AuditEvent.from_row(r.seq, r.payload, r.event_hash) for r in store.iter_audit()]


# principals of the tests (the default consent policy permits each of them for its purpose)
ADMIN = Principal("test-admin", Role.ADMIN, Purpose.OPERATIONS)
AGENT = Principal("msm-mem-agent", Role.AGENT, Purpose.TREATMENT)
CLINICIAN = Principal("dr-test", Role.CLINICIAN, Purpose.TREATMENT)
CRITIC = Principal("report-signer", Role.CRITIC, Purpose.TREATMENT)
SYSTEM = Principal("msm-mem", Role.SYSTEM, Purpose.OPERATIONS)
INGEST = Principal("msm-mem-ingest", Role.SYSTEM, Purpose.OPERATIONS)
AUDITOR = Principal("auditor-1", Role.AUDITOR, Purpose.AUDIT)
EXPORTER = Principal("dr-export", Role.CLINICIAN, Purpose.EXPORT)
