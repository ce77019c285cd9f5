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


def test_the_fakes_are_one_sorted_namespace() -> None:
    """msm_mem.testing exports its fakes under one sorted __all__, each importable from it."""
    import msm_mem.testing as testing

    assert list(testing.__all__) == sorted(testing.__all__)
    assert {"FakeChatServer", "InMemoryKeyProvider", "InMemoryWrappedKeyStore"} <= set(testing.__all__)
    assert all(hasattr(testing, name) for name in testing.__all__)


def test_in_memory_key_provider_round_trips_and_rotates() -> None:
    """The in-memory provider wraps a data key and still unwraps it after a rotation."""
    from msm_mem._governance.keys import KeyProvider
    from msm_mem.testing import InMemoryKeyProvider

    provider = InMemoryKeyProvider()
    assert isinstance(provider, KeyProvider)
    kek_id, wrapped = provider.wrap(b"k" * 32)
    assert provider.rotate() != kek_id and provider.unwrap(kek_id, wrapped) == b"k" * 32
