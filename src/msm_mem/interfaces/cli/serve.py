"""The service command: the memory over HTTP (needs the `server` extra)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ... import MissingExtra
from .registry import TENANT_HELP, backbone_flags, backbone_of, command

__all__ = ["cmd_serve"]


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--workers", type=int, default=1, help="worker processes, on either store (default 1)")
    p.add_argument(
        "--database-url", default=os.environ.get("MSM_MEM_DATABASE_URL"), help="PostgreSQL store (default: DIR's)"
    )
    p.add_argument("--tenant", default=os.environ.get("MSM_MEM_TENANT"), help=TENANT_HELP + "; must be DIR's")
    p.add_argument(
        "--threads", type=int, default=8, help="threads per worker process running requests' work (default 8)"
    )
    p.add_argument("--max-upload-mb", type=int, default=16, help="largest image upload, MiB (default 16)")
    p.add_argument("--max-image-side", type=int, default=8192, help="largest image side, pixels (default 8192)")
    p.add_argument("--max-question-chars", type=int, default=2000, help="longest question (default 2000)")
    p.add_argument(
        "--max-decoded-mb",
        type=int,
        default=64,
        help="largest decoded image (pixels x channels x bytes), MiB (default 64)",
    )
    p.add_argument("--max-decodes", type=int, default=2, help="image decodes at once per worker process (default 2)")
    p.add_argument(
        "--rate-per-credential",
        type=float,
        default=200.0,
        help="requests a second per credential (default 200; 0: none)",
    )
    p.add_argument(
        "--rate-per-address",
        type=float,
        default=1000.0,
        help="requests a second per client address (default 1000; 0: none)",
    )
    p.add_argument(
        "--max-login-failures",
        type=int,
        default=20,
        help="failed logins per address a minute before it waits (default 20)",
    )
    p.add_argument("--jwt-key", type=Path, help="PEM public key (or HMAC secret file) verifying JWT bearer tokens")
    p.add_argument("--jwt-issuer", help="the issuer (iss) JWTs must name")
    p.add_argument("--jwt-audience", help="the audience (aud) JWTs must name")
    p.add_argument("--ssl-certfile", help="serve TLS with this certificate (PEM); else put a TLS proxy in front")
    p.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    backbone_flags(p)


@command("serve", _configure, role=None)
def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the store over HTTP (FastAPI on uvicorn) until interrupted.

    Every request carries a bearer credential (an API key from `msm-mem keys api-key create`,
    or a JWT verified against --jwt-key); its principal and patient scope are the caller's,
    whatever the request says. The OpenAPI schema is at /openapi.json, the docs at /docs, and
    the memory explorer (a web page signing in with the same keys) at /ui.
    Loopback only by default; for other hosts put TLS in front (see docs/deploy.md).

    The model that answers ask is --backbone (default nonparametric) with its options; the
    options are checked and the model server probed before the server starts, and a request
    it cannot answer is a 503 problem with nothing written (docs/backbones.md)."""
    try:
        from ..http.config import ServeConfig
        from ..http.serve import run
    except ImportError as exc:
        raise MissingExtra(exc.name or "fastapi", "server") from None
    config = ServeConfig(
        args.dir,
        database_url=args.database_url,
        tenant=args.tenant,
        max_upload_bytes=args.max_upload_mb * 1024 * 1024,
        max_image_side=args.max_image_side,
        max_question_chars=args.max_question_chars,
        max_decoded_bytes=args.max_decoded_mb * 1024 * 1024,
        max_decodes=args.max_decodes,
        rate_per_credential=args.rate_per_credential,
        rate_per_address=args.rate_per_address,
        max_login_failures=args.max_login_failures,
        max_threads=args.threads,
        jwt_key=args.jwt_key,
        jwt_issuer=args.jwt_issuer,
        jwt_audience=args.jwt_audience,
        backbone=backbone_of(args),
    )
    run(
        config,
        host=args.host,
        port=args.port,
        workers=args.workers,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        log_level=args.log_level,
    )
    return 0
