"""The MCP command: the memory as tools and resources for agents (needs the `mcp` extra)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ... import InvalidInput, MissingExtra, Role
from ..auth.apikeys import parse_patients
from ..auth.credentials import Unauthenticated, Verifier
from ..backbone import probe
from . import identity
from .registry import TENANT_HELP, backbone_flags, backbone_of, command, open_mem

if TYPE_CHECKING:
    from ..mcp.identity import Identity

__all__ = ["TOKEN_ENV", "cmd_mcp"]

#: the stdio server's credential (an API key, or a JWT when --jwt-key is given)
TOKEN_ENV = "MSM_MEM_API_KEY"


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="default stdio")
    p.add_argument("--host", default="127.0.0.1", help="http: address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="http: port (default 8765); the endpoint is /mcp")
    p.add_argument(
        "--image-root",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a folder whose images tools may name by path (repeatable; default none: base64 or stored studies)",
    )
    p.add_argument("--patients", help="stdio without an API key: the patient scope (P1,P2 or * for all)")
    g = p.add_argument_group(
        "stdio without an API key: the acting principal",
        "default: MSM_MEM_ACTOR/_ROLE/_PURPOSE, else DIR/identity.json (acting as agent)",
    )
    g.add_argument("--actor", metavar="ID", help="who is acting (an id, never a patient's)")
    g.add_argument("--role", metavar="ROLE", help=", ".join(r.value for r in Role))
    g.add_argument("--purpose", metavar="PURPOSE", help="the purpose of use (default: the role's usual one)")
    p.add_argument(
        "--database-url", default=os.environ.get("MSM_MEM_DATABASE_URL"), help="PostgreSQL store (default: DIR's)"
    )
    p.add_argument("--tenant", default=os.environ.get("MSM_MEM_TENANT"), help=TENANT_HELP + "; must be DIR's")
    p.add_argument("--max-upload-mb", type=int, default=16, help="largest image, MiB (default 16)")
    p.add_argument("--max-image-side", type=int, default=8192, help="largest image side, pixels (default 8192)")
    p.add_argument("--max-question-chars", type=int, default=2000, help="longest question (default 2000)")
    p.add_argument("--max-decodes", type=int, default=2, help="image decodes at once (default 2)")
    p.add_argument(
        "--max-login-failures",
        type=int,
        default=20,
        help="http: failed logins per address a minute before it waits (default 20)",
    )
    p.add_argument("--jwt-key", type=Path, help="PEM public key (or HMAC secret file) verifying JWT bearer tokens")
    p.add_argument("--jwt-issuer", help="the issuer (iss) JWTs must name")
    p.add_argument("--jwt-audience", help="the audience (aud) JWTs must name")
    p.add_argument("--ssl-certfile", help="http: serve TLS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", help="http: the certificate's private key (PEM)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="to stderr")
    backbone_flags(p)


def _stdio_identity(args: argparse.Namespace, verifier: Verifier) -> Identity:
    from ..mcp.identity import ConfiguredIdentity, TokenIdentity

    token = os.environ.get(TOKEN_ENV, "").strip()
    named = any(getattr(args, k) for k in ("actor", "role", "purpose", "patients"))
    if token:
        if named:
            raise InvalidInput(
                f"{TOKEN_ENV} names the principal and patient scope: drop --actor/--role/--purpose/--patients"
            )
        try:
            return TokenIdentity(verifier, token)
        except Unauthenticated as exc:
            raise InvalidInput(f"{TOKEN_ENV} is refused: {exc}") from None
    if not args.patients:
        raise InvalidInput(
            f"stdio needs a credential: set {TOKEN_ENV} to an API key (msm-mem keys api-key create), "
            "or give --patients P1,P2 (or *) for the configured identity"
        )
    flags = {"actor": args.actor, "role": args.role, "purpose": args.purpose}
    glob = {k: getattr(args, f"global_{k}", None) for k in ("actor", "role", "purpose")}
    given = identity.Given.of(flags, glob, identity.environment())
    who = identity.resolve(given, args.dir, role=Role.AGENT)
    return ConfiguredIdentity(who, parse_patients(args.patients))


@command("mcp", _configure, role=None)
def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve the store to agents over MCP (stdio, or streamable HTTP at /mcp) until the client leaves or Ctrl-C.

    Tools: ask, context, record_answer, retrieve, observe, consolidate, feedback, patient_state,
    patient_history, verify_audit, whoami (context gives an agent's own model the fused prompt
    and the image; record_answer writes its answer back). Resources: msm-mem://patients/{patient_id}/timeline and
    msm-mem://patients/{patient_id}/claims/{key}/chain. Every call is scoped to the caller's
    patients, consent-checked and audited, as in `msm-mem serve`; errors are RFC 9457 problems.

    Who a call acts as. Over http, each request's bearer token: an API key from
    `msm-mem keys api-key create` or a JWT verified against --jwt-key; its principal and patient
    scope, never an argument. Over stdio, the server acts for the client that started it: with
    MSM_MEM_API_KEY set, that key (verified at start and on every call, so revoking it ends the
    session); without it, the configured identity (--actor/--role/--purpose, MSM_MEM_ACTOR/_ROLE/
    _PURPOSE, else DIR/identity.json acting as agent) over the patients named by --patients.
    Images come as base64, as a path inside an --image-root folder, or as a stored study.
    The model that answers ask is --backbone with its options, checked and probed at start."""
    try:
        from ..http.config import ServeConfig
        from ..mcp.config import McpConfig
        from ..mcp.identity import HttpIdentity
        from ..mcp.server import run_http, run_stdio
        from ..mcp.state import McpState
    except ImportError as exc:
        raise MissingExtra(exc.name or "mcp", "mcp") from None
    if args.transport == "http" and any(getattr(args, k) for k in ("actor", "role", "purpose", "patients")):
        raise InvalidInput(
            "over http each request's bearer token names the principal: drop --actor/--role/--purpose/--patients"
        )
    serve = ServeConfig(
        args.dir,
        database_url=args.database_url,
        tenant=args.tenant,
        max_upload_bytes=args.max_upload_mb * 1024 * 1024,
        max_image_side=args.max_image_side,
        max_question_chars=args.max_question_chars,
        max_decodes=args.max_decodes,
        max_login_failures=args.max_login_failures,
        jwt_key=args.jwt_key,
        jwt_issuer=args.jwt_issuer,
        jwt_audience=args.jwt_audience,
        backbone=backbone_of(args),
    )
    config = McpConfig(serve, tuple(args.image_root))
    backbone = serve.backbone.build()
    verifier = serve.verifier()
    who: Identity = HttpIdentity() if args.transport == "http" else _stdio_identity(args, verifier)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    answered = probe(backbone)
    if answered:
        logging.getLogger(__name__).info("backbone %s: its model server answers (%s)", serve.backbone.name, answered)
    with open_mem(args, database_url=args.database_url, tenant=args.tenant, backbone=backbone) as mem:
        state = McpState(mem, config, who)
        if args.transport == "http":
            tls = {"ssl_certfile": args.ssl_certfile, "ssl_keyfile": args.ssl_keyfile}
            run_http(state, verifier, host=args.host, port=args.port, log_level=args.log_level, **tls)
        else:
            run_stdio(state, log_level=args.log_level)
    return 0
