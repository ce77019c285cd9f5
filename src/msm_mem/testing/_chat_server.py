"""A scripted, local OpenAI-compatible chat-completions server for tests (no model, no network).

Use it to exercise :class:`~msm_mem.plugins.backbones.openai_http.OpenAICompatibleBackbone`
(or anything that speaks the protocol) end to end over real HTTP on ``127.0.0.1``::

    with FakeChatServer(["No acute findings [E-1]."]) as server:
        backbone = OpenAICompatibleBackbone(server.base_url, "fake-model")
        reply = backbone.generate(request)
        assert server.requests[0].json["model"] == "fake-model"

Every ``POST /v1/chat/completions`` consumes the next scripted :class:`FakeReply` (a plain
string is shorthand for a 200 completion with that text); once the script is used up, the
``default`` reply answers (``None``: HTTP 500). ``GET /v1/models`` lists ``model`` (what
a health probe asks); other paths and methods get 404. Received requests are recorded in
order in :attr:`FakeChatServer.requests` (and, with ``record``, appended to that file as JSON
lines). The server binds port 0 (the OS picks a free port) and runs in a background thread;
:meth:`FakeChatServer.close` wakes any delayed reply and joins every thread, so nothing
outlives the ``with`` block.

As a process of its own (a model server on loopback, for end-to-end tests and demos)::

    python -m msm_mem.testing chat-server --script replies.json --record requests.jsonl

prints its ``base_url`` on the first line of stdout and serves until it is sent SIGTERM or
SIGINT or its stdin closes. ``replies.json`` is a JSON array; each entry is a string (a 200
completion with that text) or an object with ``status``, ``text`` (a completion) or ``body``
(a JSON object, or a string sent as is), ``headers`` and ``delay_s``; ``--default`` gives the
reply once the script is used up in the same form.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["FakeChatServer", "FakeReply", "RecordedRequest", "completion"]


def completion(text: str, model: str = "fake-model", fingerprint: str = "") -> dict[str, Any]:
    """A minimal, well-formed chat-completions response body whose content is ``text``, naming
    ``model`` and (when given) its ``system_fingerprint``."""
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }
    if fingerprint:
        body["system_fingerprint"] = fingerprint
    return body


@dataclass(frozen=True)
class FakeReply:
    """One scripted response: HTTP ``status``, a ``body`` (a dict is sent as JSON, str/bytes
    as is), extra ``headers``, and ``delay_s`` seconds to wait before answering."""

    status: int = 200
    body: Mapping[str, Any] | str | bytes = field(default_factory=lambda: completion("ok"))
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0

    @classmethod
    def text(cls, text: str) -> FakeReply:
        """A 200 completion whose message content is ``text``."""
        return cls(200, completion(text))

    @classmethod
    def from_json(cls, entry: object) -> FakeReply:
        """A reply from its JSON form (see the module docstring); ValueError for another shape."""
        if isinstance(entry, str):
            return cls.text(entry)
        if not isinstance(entry, dict) or set(entry) - {"status", "text", "body", "headers", "delay_s", "model"}:
            raise ValueError(
                f"a scripted reply is a string or an object of status, text, body, headers, delay_s: {entry!r}"
            )
        text, model = str(entry.get("text", "ok")), str(entry.get("model", "fake-model"))
        body: Mapping[str, Any] | str | bytes = completion(text, model)
        if "body" in entry:
            body = entry["body"]
        return cls(int(entry.get("status", 200)), body, dict(entry.get("headers", {})), float(entry.get("delay_s", 0)))


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received: method, path, headers (lower-case names), raw body,
    and the body parsed as JSON (None when it is not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # handler threads are joined by server_close()
    block_on_close = True

    def __init__(self, owner: FakeChatServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.owner = owner

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (timeout) closes its socket; writing to it then fails: expected
        pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        pass  # keep test output quiet

    def _send(self, reply: FakeReply) -> None:
        body = reply.body
        if isinstance(body, Mapping):
            data, ctype = json.dumps(body).encode("utf-8"), "application/json"
        else:
            data = body.encode("utf-8") if isinstance(body, str) else body
            ctype = "text/plain; charset=utf-8"
        self.send_response(reply.status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802 (stdlib name)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = None
        owner = self.server.owner
        owner._record(RecordedRequest("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, raw, parsed))
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/chat/completions":
            self._send(FakeReply(404, {"error": {"message": f"no route {self.path}"}}))
            return
        reply = owner._next()
        if reply.delay_s > 0:
            owner._closing.wait(reply.delay_s)
        self._send(reply)

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        owner = self.server.owner
        owner._record(RecordedRequest("GET", self.path, {k.lower(): v for k, v in self.headers.items()}, b"", None))
        if self.path.split("?", 1)[0].rstrip("/") == "/v1/models":
            self._send(FakeReply(200, {"object": "list", "data": [{"id": owner.model, "object": "model"}]}))
            return
        self._send(FakeReply(404, {"error": {"message": "only POST /v1/chat/completions and GET /v1/models"}}))


class FakeChatServer:
    """A scripted chat-completions server on 127.0.0.1 (see the module docstring).

    ``base_url`` (``http://127.0.0.1:<port>/v1``) is valid between :meth:`start` (or
    ``__enter__``) and :meth:`close`.
    """

    def __init__(
        self,
        replies: Iterable[FakeReply | str] = (),
        *,
        default: FakeReply | str | None = None,
        model: str = "fake-model",
        record: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model = model
        self._record_path = None if record is None else Path(record)
        self._script: deque[FakeReply] = deque(self._coerce(r) for r in replies)
        self._default = None if default is None else self._coerce(default)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._requests: list[RecordedRequest] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def _coerce(reply: FakeReply | str) -> FakeReply:
        return FakeReply.text(reply) if isinstance(reply, str) else reply

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            if self._record_path is not None:
                line = {
                    "method": request.method,
                    "path": request.path,
                    "headers": request.headers,
                    "json": request.json,
                }
                with self._record_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(line) + "\n")

    def _next(self) -> FakeReply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        if self._default is not None:
            return self._default
        return FakeReply(500, {"error": {"message": "fake server: no scripted reply left"}})

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of the requests received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def base_url(self) -> str:
        """The API root to give a client, e.g. ``http://127.0.0.1:54321/v1``."""
        if self._server is None:
            raise RuntimeError("the fake server is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def push(self, *replies: FakeReply | str) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(self._coerce(r) for r in replies)

    def start(self) -> FakeChatServer:
        """Bind a free port and serve in a background thread; returns ``self``."""
        if self._server is None:
            self._closing.clear()
            self._server = _Server(self)
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, wake delayed replies, and join every thread (idempotent)."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._closing.set()
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = self._thread = None

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """Serve as a process of its own (see the module docstring) until SIGTERM, SIGINT or the
    end of stdin."""
    parser = argparse.ArgumentParser(prog="python -m msm_mem.testing chat-server", description=main.__doc__)
    parser.add_argument("--script", type=Path, help="JSON array of scripted replies")
    parser.add_argument("--default", help="the reply once the script is used up, as JSON (default: HTTP 500)")
    parser.add_argument("--record", type=Path, help="append every request received to this file as a JSON line")
    parser.add_argument("--model", default="fake-model", help="the model GET /v1/models lists")
    args = parser.parse_args(argv)
    script = json.loads(args.script.read_text(encoding="utf-8")) if args.script else []
    if not isinstance(script, list):
        parser.error("--script must hold a JSON array")
    default = None if args.default is None else FakeReply.from_json(json.loads(args.default))
    replies = [FakeReply.from_json(entry) for entry in script]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    with FakeChatServer(replies, default=default, model=args.model, record=args.record) as server:
        print(server.base_url, flush=True)
        stop.wait()
    return 0
