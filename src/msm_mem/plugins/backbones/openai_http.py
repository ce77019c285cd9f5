"""A backbone that calls an OpenAI-compatible chat-completions endpoint over HTTP.

Works with any server that speaks ``POST {base_url}/chat/completions`` (vLLM, Ollama,
llama.cpp's server, TGI). Only the standard library is used (``urllib.request`` + ``json``),
so this backbone needs no extra dependency.

The fused prompt is sent as the user message. When the request carries an image it is
encoded as a PNG (grayscale, 8-bit, ``round(v * 255)`` of the ``[0, 1]`` values) in a
``data:image/png;base64,...`` URL, and the user message becomes the content parts
``[{"type": "text"}, {"type": "image_url"}]``; without an image the content is plain text.

Failures: a connection error, a timeout, HTTP 429 or any 5xx is retried up to ``retries``
times, waiting ``backoff_s * 2**attempt`` seconds (or the server's ``Retry-After``, capped at
:data:`MAX_RETRY_AFTER_S`) between attempts; any other 4xx is not retried. Every failure ends
in :class:`~msm_mem._errors.BackendError` naming the URL, the HTTP status, a short excerpt of
the body and the attempts made. A reply that is not JSON, has no ``choices`` or has empty
content is a ``BackendError`` too (not retried: the server answered).

Privacy: the prompt and the image are never logged; DEBUG records carry only the URL, model,
prompt length in characters and the image shape.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from ..._errors import BackendError, InvalidInput
from ..images import to_rgb_uint8
from .base import BackboneReply, BackboneRequest

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "MAX_RETRY_AFTER_S",
    "OpenAICompatibleBackbone",
    "cited_ids",
    "image_data_url",
]

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful radiology assistant. Answer the current question using the patient's "
    "history, the similar prior encounters and images in the prompt, and the attached image. "
    "Cite the memory ids you rely on in square brackets, e.g. [E-...]. Be concise; if the "
    "evidence is insufficient, say so."
)
"""The system message sent with every request unless another one is given."""

MAX_RETRY_AFTER_S = 30.0
"""The longest wait (seconds) honoured from a ``Retry-After`` header."""

_EXCERPT = 200  # characters of a response body quoted in an error message
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,200})\]")
_ID = re.compile(  # starts with a letter, so bracketed dates like [2024-01-31] never match
    r"^[A-Za-z][A-Za-z0-9_]*-[A-Za-z0-9_.:-]+$"
)


def cited_ids(prompt: str, reply: str, known: Iterable[str] = ()) -> tuple[str, ...]:
    """Memory ids the reply cites, in order of first mention, without repeats.

    An id is citable when it appears in brackets in the prompt (``[E-3f...]``, dates such as
    ``[2024-01-31]`` excluded) or is in ``known`` (the request's candidate ids). It counts as
    cited when it occurs in the reply as a whole token (bracketed or bare), so ids a model
    invents are never reported.
    """
    citable = {t.strip() for t in known if t.strip()}
    for bracketed in _BRACKETED.finditer(prompt):
        token = bracketed.group(1).strip()
        if _ID.match(token):
            citable.add(token)
    found: list[tuple[int, str]] = []
    for ident in citable:
        m = re.search(rf"(?<![\w-]){re.escape(ident)}(?![\w-])", reply)
        if m:
            found.append((m.start(), ident))
    return tuple(ident for _, ident in sorted(found))


def image_data_url(image: npt.NDArray[Any]) -> str:
    """A ``data:image/png;base64,...`` URL of a ``[0, 1]`` grayscale (or RGB) image.

    A 2-D image becomes an 8-bit grayscale PNG (``round(clip(v, 0, 1) * 255)``); an
    ``(h, w, 3)`` image an RGB PNG.
    """
    rgb = to_rgb_uint8(image)
    gray = np.asarray(image).ndim == 2
    pil = Image.fromarray(np.ascontiguousarray(rgb[:, :, 0]) if gray else rgb)
    buf = io.BytesIO()
    pil.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _excerpt(body: bytes | str) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def _retry_after(value: str | None) -> float | None:
    try:
        return None if value is None else min(max(float(value), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None


class OpenAICompatibleBackbone:
    """Chat-completions client (see the module docstring for the wire format and retries).

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8000/v1`` (http or https);
    ``timeout_s`` bounds each attempt in seconds; ``retries`` is the number of extra attempts
    (>= 0); ``backoff_s`` the first wait in seconds, doubled after each retry; ``max_tokens``
    and ``temperature`` are passed to the server. ``sleep`` is injectable so tests need not
    wait. The reply's ``confidence`` is 0 (a generative model gives none) and ``source`` is
    ``"openai:<model>"``.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60,
        retries: int = 2,
        backoff_s: float = 0.5,
        max_tokens: int = 256,
        temperature: float = 0.0,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(f"base_url must be an http(s) URL with a host, got {base_url!r}")
        if not isinstance(model, str) or not model.strip():
            raise InvalidInput("model must be a non-empty string")
        if not timeout_s > 0:
            raise InvalidInput(f"timeout_s must be > 0, got {timeout_s!r}")
        if not isinstance(retries, int) or retries < 0:
            raise InvalidInput(f"retries must be an int >= 0, got {retries!r}")
        if not backoff_s >= 0:
            raise InvalidInput(f"backoff_s must be >= 0, got {backoff_s!r}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidInput(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if not temperature >= 0:
            raise InvalidInput(f"temperature must be >= 0, got {temperature!r}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.backoff_s = float(backoff_s)
        self.max_tokens = max_tokens
        self.temperature = float(temperature)
        self.system_prompt = system_prompt
        self._api_key = api_key
        self._sleep = sleep

    def __repr__(self) -> str:  # never show the key
        return f"OpenAICompatibleBackbone(base_url={self.base_url!r}, model={self.model!r})"

    def payload(self, request: BackboneRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (exposed so callers can inspect it)."""
        content: str | list[dict[str, Any]] = request.prompt
        if request.image is not None:
            content = [
                {"type": "text", "text": request.prompt},
                {"type": "image_url", "image_url": {"url": image_data_url(request.image)}},
            ]
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": content})
        return {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": False,
        }

    def generate(self, request: BackboneRequest) -> BackboneReply:
        """Send the request, retrying transient failures; raises BackendError on failure."""
        body = json.dumps(self.payload(request)).encode("utf-8")
        shape = None if request.image is None else tuple(np.asarray(request.image).shape)
        log.debug("POST %s model=%s prompt_chars=%d image=%s", self.url, self.model, len(request.prompt), shape)
        raw = self._post(body)
        text = self._content(raw)
        known = [c.id for c in request.candidates] + [c.id for c in request.prior]
        return BackboneReply(
            answer=text,
            cited=cited_ids(request.prompt, text, known),
            source=f"openai:{self.model}",
        )

    def _post(self, body: bytes) -> bytes:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        attempts = self.retries + 1
        problem = short = ""
        for attempt in range(attempts):
            wait = self.backoff_s * (2**attempt)
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                # the scheme was checked in __init__: only http(s) reaches urlopen
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                    data: bytes = resp.read()
                    return data
            except urllib.error.HTTPError as exc:
                with exc:
                    short = f"HTTP {exc.code}"
                    problem = f"{short}: {_excerpt(exc.read())!r}"
                    if exc.code != 429 and exc.code < 500:
                        raise BackendError(f"POST {self.url} failed with {problem} (a 4xx is not retried)") from None
                    hinted = _retry_after(exc.headers.get("Retry-After") if exc.headers else None)
                    wait = wait if hinted is None else hinted
            except TimeoutError:  # socket.timeout is TimeoutError since Python 3.10
                problem = short = f"timed out after {self.timeout_s:g} s"
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, TimeoutError):
                    problem = short = f"timed out after {self.timeout_s:g} s"
                else:
                    problem = short = f"connection error: {exc.reason}"
            except OSError as exc:  # connection reset or refused mid-request
                problem = short = f"connection error: {exc}"
            if attempt + 1 < attempts:
                # the body excerpt may echo the request, so only the status is logged
                log.warning("POST %s: %s; retry %d of %d in %.2f s", self.url, short, attempt + 1, self.retries, wait)
                self._sleep(wait)
        raise BackendError(
            f"POST {self.url} failed: {problem}; gave up after {attempts} attempt(s) "
            "(connection errors, timeouts, HTTP 429 and 5xx are retried)"
        )

    def _content(self, raw: bytes) -> str:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise BackendError(f"POST {self.url}: reply is not JSON: {_excerpt(raw)!r}") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise BackendError(f"POST {self.url}: reply has no choices: {_excerpt(raw)!r}")
        first = choices[0]
        message = first.get("message") if isinstance(first, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # some servers return content parts
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            content = "".join(t for t in texts if isinstance(t, str))
        if not isinstance(content, str) or not content.strip():
            raise BackendError(f"POST {self.url}: reply has empty content: {_excerpt(raw)!r}")
        return content.strip()
