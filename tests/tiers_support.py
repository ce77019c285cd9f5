"""What test_tiers and test_tiers_failures share: the clock's start, the answer of their fixed
backbone, the agent, embeddings of test images, row counts and an auditor's consent."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from msm_mem import Principal
from msm_mem._api.mem import MsmMem
from msm_mem._records import new_id
from msm_mem._storage.base import Store
from msm_mem._tier_records import ConsentRecord
from tests.helpers import ADMIN
from tests.helpers import png as _png
from tests.layers import Layers

T0 = 1_700_000_000.0
ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"
AGENT = Principal("agent-1", "agent")


def _z(layers: Layers, folder: Path, seed: int) -> np.ndarray:
    from msm_mem.plugins.images import load_image

    z: np.ndarray = layers.encoder.encode([load_image(_png(folder, seed))])[0]
    return z


def _counts(s: Store) -> tuple[int, ...]:
    # every version of every claim key with an active version (a new claim is always active)
    claims = sum(len(s.claim_history(p, c.key)) for p in ("P1", "P2") for c in s.claims_active(p))
    return (len(s.stm_list()), s.count("episodic"), s.count("visual"), s.count("semantic"), claims)


def _grant_auditor(mem: MsmMem) -> None:
    mem.grant(
        ADMIN, [ConsentRecord(new_id("C"), "*", "role:auditor", "treatment", "permit", ("*",), 0.0, created_at=T0)]
    )


# fail closed -------------------------------------------------------------------------------
