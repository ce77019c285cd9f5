"""Tests of the fakes shipped in msm_mem.testing."""

from __future__ import annotations

from msm_mem.plugins.backbones.base import BackboneRequest
from msm_mem.testing import FixedBackbone


def test_fixed_backbone_answers_the_same_whatever_it_is_asked() -> None:
    """Every request gets the configured answer and decision; the source is the backbone's name."""
    backbone = FixedBackbone("Small left effusion.", "drain", name="stub")
    for question in ("What is the impression?", "Any change since prior?"):
        reply = backbone.generate(BackboneRequest(prompt=f"Q: {question}", question=question))
        assert (reply.answer, reply.decision, reply.source) == ("Small left effusion.", "drain", "stub")
    assert (
        backbone.name == "stub" and FixedBackbone("x").generate(BackboneRequest(prompt="", question="?")).decision == ""
    )
