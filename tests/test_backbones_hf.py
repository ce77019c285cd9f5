"""Tests of the in-process ``transformers`` backbone on a tiny, randomly initialised LLaVA.

The model (a 1-layer CLIP vision tower, a 1-layer Llama text model, a word-level tokenizer
trained here on a few sentences) is written with ``save_pretrained`` and loaded back through
the real ``from_pretrained`` path, with outbound connections blocked.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem._errors import BackendError, InvalidInput, MissingExtra
from msm_mem.plugins.backbones import Backbone, BackboneRequest, Candidate, get_backbone

HAVE_HF = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="torch/transformers not installed (extra 'hf')")

CORPUS = [
    "USER: what does the chest x-ray show ? ASSISTANT: no acute cardiopulmonary findings .",
    "consolidation in the right lower lobe , small left pleural effusion .",
    "interval improvement of the bilateral opacities compared with the prior study .",
]
TEMPLATE = (
    "{% for m in messages %}[[{{ m['role'] }}]] {% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %} [[assistant]]{% endif %}"
)
PROMPT = (
    "## Similar prior encounters (episodic memory)\n"
    "[E-1a2b] cos=0.910 | 2024-01-02 | Q: what does the chest x-ray show ? | A: small left "
    "pleural effusion .\n## Current question\nwhat does the chest x-ray show ?"
)


def _build(folder: Path, chat_template: str | None) -> Path:
    """Write a tiny random LLaVA (model + processor) to ``folder``."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<pad>", "<unk>", "<s>", "</s>", "<image>"]
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=specials))
    fast = tf.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )
    image_cls = getattr(tf, "CLIPImageProcessorPil", tf.CLIPImageProcessor)  # no torchvision
    images = image_cls(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = tf.LlavaProcessor(  # type: ignore[no-untyped-call]
        image_processor=images,
        tokenizer=fast,
        patch_size=8,
        image_token="<image>",
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=chat_template,
    )
    vision = tf.CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
        projection_dim=16,
    )
    text = tf.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    image_id = fast.convert_tokens_to_ids("<image>")
    assert isinstance(image_id, int)
    config = tf.LlavaConfig(
        vision_config=vision,
        text_config=text,
        vision_feature_layer=-1,
        image_token_index=image_id,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    tf.LlavaForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two saved tiny models: one without a chat template (plain format), one with."""
    if not HAVE_HF:
        pytest.skip("torch/transformers not installed (extra 'hf')")
    root = tmp_path_factory.mktemp("tiny-llava")
    return {
        "plain": _build(root / "plain", None),
        "templated": _build(root / "templated", TEMPLATE),
    }


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE=1 and every outbound socket connection fails."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(self: socket.socket, address: Any) -> None:
        raise OSError(f"network disabled in this test (tried {address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _request(image: bool = True) -> BackboneRequest:
    img = np.linspace(0, 1, 24 * 20, dtype=np.float32).reshape(24, 20) if image else None
    cand = Candidate("E-1a2b", "episodic", "small left pleural effusion .", "", 0.9, 0.0)
    return BackboneRequest(PROMPT, "what does the chest x-ray show ?", (cand,), image=img)


@needs_hf
def test_loads_saved_model_and_generates_offline(tiny_models: dict[str, Path], offline: None) -> None:
    """get_backbone('transformers') loads the saved folder and returns a non-empty string reply."""
    backbone = get_backbone("transformers", model_id_or_path=tiny_models["plain"], max_new_tokens=6)
    assert isinstance(backbone, Backbone) and backbone.name == "transformers"
    reply = backbone.generate(_request())
    assert isinstance(reply.answer, str) and reply.answer and reply.answer == reply.answer.strip()
    assert reply.source == f"transformers:{tiny_models['plain']}"
    assert set(reply.cited) <= {"E-1a2b"} and reply.confidence == 0.0
    assert len(reply.answer.split()) <= 6  # word-level tokenizer: one word per new token


@needs_hf
def test_generation_is_greedy_and_deterministic(tiny_models: dict[str, Path], offline: None) -> None:
    """The same request gives the same answer twice, with and without an image."""
    from msm_mem.plugins.backbones.hf import TransformersBackbone

    backbone = TransformersBackbone(tiny_models["plain"], max_new_tokens=5, dtype="float32")
    for with_image in (True, False):
        first = backbone.generate(_request(with_image)).answer
        assert first and backbone.generate(_request(with_image)).answer == first


@needs_hf
def test_plain_prompt_format_without_chat_template(tiny_models: dict[str, Path], offline: None) -> None:
    """With no chat template the prompt is 'USER: <image>\\n{prompt} ASSISTANT:'."""
    from msm_mem.plugins.backbones.hf import TransformersBackbone

    backbone = TransformersBackbone(tiny_models["plain"])
    assert backbone.render("hello", True) == "USER: <image>\nhello ASSISTANT:"
    assert backbone.render("hello", False) == "USER: hello ASSISTANT:"


@needs_hf
def test_chat_template_is_used_when_present(tiny_models: dict[str, Path], offline: None) -> None:
    """A processor with a chat template renders through it, and generation still works."""
    from msm_mem.plugins.backbones.hf import TransformersBackbone

    backbone = TransformersBackbone(tiny_models["templated"], max_new_tokens=4)
    assert backbone.render("hello", True) == "[[user]] <image>\nhello [[assistant]]"
    assert backbone.render("hello", False) == "[[user]] hello [[assistant]]"
    assert backbone.generate(_request()).answer


@needs_hf
def test_invalid_options_raise_invalid_input(tiny_models: dict[str, Path], offline: None) -> None:
    """A bad dtype, max_new_tokens or device is refused before anything loads."""
    from msm_mem.plugins.backbones.hf import TransformersBackbone

    with pytest.raises(InvalidInput, match="dtype"):
        TransformersBackbone(tiny_models["plain"], dtype="int8")
    with pytest.raises(InvalidInput, match="max_new_tokens"):
        TransformersBackbone(tiny_models["plain"], max_new_tokens=0)
    with pytest.raises(InvalidInput, match="device"):
        TransformersBackbone(tiny_models["plain"], device="no-such-device")


@needs_hf
def test_unloadable_model_raises_backend_error(tmp_path: Path, offline: None) -> None:
    """A folder without a model (and no network to fall back on) raises BackendError."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BackendError, match="cannot load model"):
        get_backbone("transformers", model_id_or_path=empty)


def test_missing_transformers_raises_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without transformers importable, get_backbone names the 'hf' extra."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(MissingExtra) as info:
        get_backbone("transformers", model_id_or_path="any/model")
    assert info.value.extra == "hf" and "msm-mem[hf]" in str(info.value)
