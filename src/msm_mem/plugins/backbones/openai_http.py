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
in a :class:`~msm_mem._errors.BackendError` naming the URL, the HTTP status, a short excerpt of
the body and the attempts made: :class:`~msm_mem._errors.BackendUnavailable` when the retried
failures ran out (the server is down, slow or overloaded), a plain ``BackendError`` for a
4xx. A reply that is not JSON, has no ``choices`` or has empty content is a ``BackendError``
too (not retried: the server answered). The answer is cleaned before anyone stores it
(:func:`cleaned_reply`: control and invisible characters removed, at most
:data:`MAX_REPLY_CHARS`); the reply names the model the server reports and its
``system_fingerprint`` as the version. :meth:`OpenAICompatibleBackbone.probe` checks at start
that the server answers.

Privacy: the prompt and the image are never logged; DEBUG records carry only the URL, model,
prompt length in characters and the image shape.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import re
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from ..._errors import BackendError, BackendUnavailable, InvalidInput
from ..images import to_rgb_uint8
from .base import BackboneReply, BackboneRequest

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "MAX_REPLY_BYTES",
    "MAX_REPLY_CHARS",
    "MAX_RETRY_AFTER_S",
    "MAX_TIMEOUT_S",
    "OpenAICompatibleBackbone",
    "cited_ids",
    "cleaned_reply",
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

MAX_TIMEOUT_S = 600.0
"""The longest ``timeout_s`` (seconds) one attempt may be given."""

MAX_REPLY_CHARS = 32_768
"""The longest answer (characters) taken from a model; a longer one is a BackendError."""

MAX_REPLY_BYTES = 4 * 1024 * 1024
"""The largest response body (bytes) read from the server; a larger one is a BackendError."""

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


def _number(name: str, value: object, low: float, high: float, *, low_open: bool = False) -> float:
    """``value`` as a float in [low, high] (``low`` excluded with ``low_open``), else InvalidInput."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > low if low_open else value >= low) and value <= high:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    side = ">" if low_open else ">="
    raise InvalidInput(f"{name} must be a number {side} {low:g} and <= {high:g}, got {value!r}")


_UNSAFE = re.compile(  # C0/C1 controls but tab and line breaks, bidi overrides/isolates, zero-width
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200d\u2060-\u2064\ufeff\u180e\u202a-\u202e\u2066-\u2069]"
)


def cleaned_reply(text: str) -> str:
    """A model's answer made safe to store: control characters (but tab and line breaks),
    bidirectional overrides and zero-width characters removed, NFC, stripped; a
    :class:`BackendError` when it is longer than :data:`MAX_REPLY_CHARS` or empty."""
    text = unicodedata.normalize("NFC", _UNSAFE.sub("", text)).strip()
    if len(text) > MAX_REPLY_CHARS:
        raise BackendError(f"the model's answer is {len(text):,} characters, over the {MAX_REPLY_CHARS:,} allowed")
    if not text:
        raise BackendError("the model's answer is empty once control characters are removed")
    return text


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
        if parts.username or parts.password:
            raise InvalidInput("base_url must not hold a user or password: give the key in api_key")
        if not isinstance(model, str) or not model.strip():
            raise InvalidInput("model must be a non-empty string")
        timeout_s = _number("timeout_s", timeout_s, 0.0, MAX_TIMEOUT_S, low_open=True)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
            raise InvalidInput(f"retries must be an integer from 0 to 10, got {retries!r}")
        backoff_s = _number("backoff_s", backoff_s, 0.0, MAX_RETRY_AFTER_S)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= 32_768:
            raise InvalidInput(f"max_tokens must be an integer from 1 to 32768, got {max_tokens!r}")
        temperature = _number("temperature", temperature, 0.0, 2.0)
        if not isinstance(system_prompt, str):
            raise InvalidInput(f"system_prompt must be a string, got {type(system_prompt).__name__}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.isprintable()):
            raise InvalidInput("api_key must be printable text")
        if not callable(sleep):
            raise InvalidInput("sleep must be a function of seconds (a test hook, not a setting)")
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
        text, reported, version = self._content(raw)
        known = [c.id for c in request.candidates] + [c.id for c in request.prior]
        return BackboneReply(
            answer=text,
            cited=cited_ids(request.prompt, text, known),
            source=f"openai:{self.model}",
            model=reported or self.model,
            model_version=version,
        )

    def probe(self) -> str:
        """Check that the server answers (``GET {base_url}/models``, one attempt, ``timeout_s``):
        returns a short description of what answered; a connection error, a timeout or a 5xx
        is a :class:`BackendError` naming the URL. A 4xx counts as reachable (some servers
        have no model list, or want a key for it)."""
        url = self.base_url + "/models"
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(url, headers=headers, method="GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 (scheme checked)
                return f"GET {url}: HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            with exc:
                if exc.code < 500:
                    return f"GET {url}: HTTP {exc.code}"
                problem = f"GET {url} gave HTTP {exc.code}"
                raise BackendUnavailable(f"the model server at {self.base_url} is unhealthy: {problem}") from None
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            what = f"timed out after {self.timeout_s:g} s" if isinstance(reason, TimeoutError) else f"{reason}"
            raise BackendUnavailable(f"the model server at {self.base_url} is unreachable: GET {url}: {what}") from None

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
                    data: bytes = resp.read(MAX_REPLY_BYTES + 1)
                    if len(data) > MAX_REPLY_BYTES:
                        raise BackendError(f"POST {self.url}: the reply is over {MAX_REPLY_BYTES:,} bytes")
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
        raise BackendUnavailable(
            f"POST {self.url} failed: {problem}; gave up after {attempts} attempt(s) "
            "(connection errors, timeouts, HTTP 429 and 5xx are retried)"
        )

    def _content(self, raw: bytes) -> tuple[str, str, str]:
        """The answer (cleaned), the model the server names and its version (its
        ``system_fingerprint``), each "" when absent."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
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
        model, version = data.get("model"), data.get("system_fingerprint")
        return (
            cleaned_reply(content),
            model if isinstance(model, str) else "",
            version if isinstance(version, str) else "",
        )
