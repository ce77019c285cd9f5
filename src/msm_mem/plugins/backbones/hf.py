"""An in-process vision-language backbone through Hugging Face ``transformers`` (LLaVA family).

Weights load with ``AutoProcessor.from_pretrained`` and
``AutoModelForImageTextToText.from_pretrained`` from either a hub id (downloaded and cached
by ``transformers``; pin ``revision`` for reproducibility) or a local folder written by
``save_pretrained`` (no network; set ``HF_HUB_OFFLINE=1`` to be sure). Remote code is never
trusted. The tests use a tiny randomly initialised LLaVA (a small CLIP vision tower and a
small Llama text model with a tokenizer trained in the test), so they check the loading and
generation path, not answer quality.

The prompt: when the processor has a chat template, one user turn whose content is the image
(if any) followed by the fused prompt, rendered with ``add_generation_prompt=True``;
otherwise the plain LLaVA-1.5 format ``"USER: <image>\\n{prompt} ASSISTANT:"`` (without
``<image>\\n`` when there is no image). The image (grayscale ``[0, 1]``) is sent as 8-bit RGB.
Decoding is greedy; the answer is the newly generated text with special tokens removed.

Needs the ``hf`` extra (``torch`` and ``transformers``); without it the constructor raises
:class:`~msm_mem._errors.MissingExtra`. Load or generation failures raise
:class:`~msm_mem._errors.BackendError`; an empty generation is a ``BackendError`` too.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import numpy as np
from PIL import Image

from ..._errors import BackendError, InvalidInput, MissingExtra
from ..images import to_rgb_uint8
from .base import BackboneReply, BackboneRequest
from .openai_http import cited_ids

__all__ = ["IMAGE_TOKEN", "TransformersBackbone"]

log = logging.getLogger(__name__)

IMAGE_TOKEN = "<image>"
"""The placeholder the plain (template-less) prompt format uses for the image."""

_DTYPES = ("auto", "float32", "float16", "bfloat16")


def _require() -> tuple[Any, Any]:
    """Import torch and transformers, or raise MissingExtra naming the ``hf`` extra."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise MissingExtra("torch", "hf") from None
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise MissingExtra("transformers", "hf") from None
    return torch, transformers


class TransformersBackbone:
    """A LLaVA-family model run in this process (see the module docstring).

    ``model_id_or_path`` is a hub id or a local ``save_pretrained`` folder; ``device`` a torch
    device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``); ``max_new_tokens`` (>= 1)
    bounds the answer length in tokens; ``dtype`` is ``"auto"`` (the checkpoint's) or one of
    ``float32``, ``float16``, ``bfloat16``; ``revision`` pins a hub commit or tag. The reply's
    ``confidence`` is 0 and ``source`` is ``"transformers:<model_id_or_path>"``.
    """

    name = "transformers"

    def __init__(
        self,
        model_id_or_path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        max_new_tokens: int = 64,
        dtype: str = "auto",
        revision: str | None = None,
    ) -> None:
        torch, transformers = _require()
        source = os.fspath(model_id_or_path)
        if not source.strip():
            raise InvalidInput("model_id_or_path must not be empty")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidInput(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if dtype not in _DTYPES:
            raise InvalidInput(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        try:
            self._device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise InvalidInput(f"invalid torch device {device!r}: {exc}") from None
        self.model_id = source
        self.max_new_tokens = max_new_tokens
        self._torch = torch
        common: dict[str, Any] = {"revision": revision, "trust_remote_code": False}
        try:
            self.processor = transformers.AutoProcessor.from_pretrained(source, **common)
            self.model = transformers.AutoModelForImageTextToText.from_pretrained(
                source, dtype=dtype if dtype == "auto" else getattr(torch, dtype), **common
            )
            self.model.to(self._device)
            self.model.eval()
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise BackendError(f"cannot load model {source!r}: {exc}") from exc
        log.debug("loaded %s on %s", source, self._device)

    def render(self, prompt: str, with_image: bool) -> str:
        """The text given to the processor for ``prompt`` (see the module docstring)."""
        template = getattr(self.processor, "chat_template", None)
        if template:
            content: list[dict[str, str]] = [{"type": "image"}] if with_image else []
            content.append({"type": "text", "text": prompt})
            rendered = self.processor.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
            )
            return str(rendered)
        image = f"{IMAGE_TOKEN}\n" if with_image else ""
        return f"USER: {image}{prompt} ASSISTANT:"

    def generate(self, request: BackboneRequest) -> BackboneReply:
        """Greedy decoding of at most ``max_new_tokens`` tokens; raises BackendError on failure."""
        images = None
        if request.image is not None:
            images = Image.fromarray(to_rgb_uint8(np.asarray(request.image)), mode="RGB")
        text = self.render(request.prompt, images is not None)
        try:
            inputs = self.processor(images=images, text=text, return_tensors="pt")
            inputs = inputs.to(self._device)
            if "pixel_values" in inputs and self.model.dtype.is_floating_point:
                inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
            with self._torch.inference_mode():
                out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
            new_tokens = out[:, inputs["input_ids"].shape[1] :]
            answer = str(self.processor.batch_decode(new_tokens, skip_special_tokens=True)[0])
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise BackendError(f"generation failed with {self.model_id!r}: {exc}") from exc
        answer = answer.strip()
        if not answer:
            raise BackendError(f"{self.model_id!r} generated no text")
        known = [c.id for c in request.candidates] + [c.id for c in request.prior]
        return BackboneReply(
            answer=answer,
            cited=cited_ids(request.prompt, answer, known),
            source=f"transformers:{self.model_id}",
        )
