"""The server's settings: one frozen object, from the ``serve`` command or the environment.

Worker processes of uvicorn build their app from the environment (``MSM_MEM_SERVE_*``), which
the ``serve`` command sets from its flags: :meth:`ServeConfig.to_env` and :meth:`from_env`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ... import InvalidInput
from ..auth.credentials import Verifier
from ..backbone import BackboneConfig
from .throttle import FailureWindow, RateLimiter, Throttle

__all__ = ["ENV", "ServeConfig"]

#: the one environment variable that carries the settings to worker processes (JSON)
ENV = "MSM_MEM_SERVE_CONFIG"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """How one server runs. Sizes are bytes, image sides pixels, lengths characters.

    ``jwt_key`` is a PEM public key file (RS256, ES256 or EdDSA tokens) or a file holding an
    HMAC secret (HS256); with it, bearer tokens that are JWTs are verified against it, and
    ``jwt_issuer`` and ``jwt_audience`` must be set (expiry, issuer and audience are checked).
    ``backbone`` is the model that answers ``ask`` (:mod:`msm_mem.interfaces.backbone`; its API
    key stays in the environment, never in these settings).
    """

    store: Path
    database_url: str | None = None
    #: checked against the store's tenant when given
    tenant: str | None = None
    max_upload_bytes: int = 16 * 1024 * 1024
    max_image_side: int = 8192
    max_image_pixels: int = 40_000_000
    #: an image's decoded pixels (pixels x channels x bytes per sample), checked from its header
    max_decoded_bytes: int = 64 * 1024 * 1024
    #: a JPEG decodes at a reduced DCT scale keeping both sides at least this long (every
    #: shipped encoder takes 224 pixels a side or less; a backbone sees the image too)
    decode_side: int = 1024
    #: image decodes running at once in a process; a request waits for a slot at most
    #: ``decode_wait_s`` seconds, then is answered 503
    max_decodes: int = 2
    decode_wait_s: float = 10.0
    #: requests a second (sustained) per credential and per client address, in bursts of
    #: ``rate_burst_s`` seconds' worth; past them a request is answered 429 (0: no limit)
    rate_per_credential: float = 200.0
    rate_per_address: float = 1000.0
    rate_burst_s: float = 2.0
    #: failed logins of one address within ``login_window_s`` seconds, after which that
    #: address is answered 429 without its credential being checked until the window passes
    max_login_failures: int = 20
    login_window_s: float = 60.0
    max_question_chars: int = 2000
    max_text_chars: int = 20_000
    max_k: int = 100
    max_page: int = 500
    #: threads of a worker process that run requests' work (decode, store, audit commit); reads
    #: finishing together share one audit commit, and more threads also contend for the
    #: interpreter; ``bench_service.py --threads`` measures the trade (docs/performance.md)
    max_threads: int = 8
    jwt_key: Path | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    log_level: str = "info"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", Path(self.store))
        if not isinstance(self.backbone, BackboneConfig):
            raise InvalidInput(f"backbone must be a BackboneConfig, got {type(self.backbone).__name__}")
        if self.jwt_key is not None:
            object.__setattr__(self, "jwt_key", Path(self.jwt_key))
            if not self.jwt_issuer or not self.jwt_audience:
                raise InvalidInput("a JWT key needs its issuer and audience (--jwt-issuer, --jwt-audience)")
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name.startswith("max_") or f.name == "decode_side") and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise InvalidInput(f"{f.name} must be a positive integer, got {value!r}")
            if f.name.startswith(("rate_", "decode_wait", "login_")) and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1e9
            ):
                raise InvalidInput(f"{f.name} must be a number of at least 0, got {value!r}")

    def throttle(self) -> Throttle:
        """This process's request limits (see :mod:`.throttle`)."""
        burst = self.rate_burst_s
        return Throttle(
            per_credential=RateLimiter(self.rate_per_credential, self.rate_per_credential * burst),
            per_address=RateLimiter(self.rate_per_address, self.rate_per_address * burst),
            logins=FailureWindow(self.max_login_failures, self.login_window_s),
            decodes=threading.BoundedSemaphore(self.max_decodes),
            decode_wait_s=self.decode_wait_s,
        )

    def verifier(self) -> Verifier:
        """The verifier of this server's bearer tokens (its store's API keys, its JWT key)."""
        return Verifier(self.store, jwt_key=self.jwt_key, issuer=self.jwt_issuer, audience=self.jwt_audience)

    def to_env(self) -> dict[str, str]:
        """The settings as the environment of a worker process."""
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "backbone"}
        doc = {k: (str(v) if isinstance(v, Path) else v) for k, v in plain.items()}
        doc["backbone"] = self.backbone.to_json()
        return {ENV: json.dumps(doc)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServeConfig:
        """The settings a ``serve`` command left in the environment."""
        env = os.environ if environ is None else environ
        text = env.get(ENV)
        if not text:
            raise InvalidInput(f"{ENV} is not set: start the server with `msm-mem serve STORE_DIR`")
        doc: dict[str, Any] = json.loads(text)
        doc["backbone"] = BackboneConfig.from_json(doc.get("backbone", {}))
        return cls(**doc)
