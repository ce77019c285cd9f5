"""The shipped fake chat server run as a process of its own on loopback: a model server the
tests reach over real HTTP, scripted reply by reply, recording what it received."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ChatProcess:
    """A running fake model server: its ``base_url`` and the file of requests it received."""

    base_url: str
    record: Path
    process: subprocess.Popen[str]

    def requests(self, method: str = "POST") -> list[dict[str, Any]]:
        """The requests received so far with ``method`` (method, path, headers, json)."""
        if not self.record.exists():
            return []
        lines = [json.loads(line) for line in self.record.read_text(encoding="utf-8").splitlines()]
        return [r for r in lines if r["method"] == method]

    def stop(self) -> None:
        """End the process (its stdin closes) and wait for it: the URL then refuses connections."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextmanager
def chat_process(folder: Path, script: Sequence[object] = (), *, default: object = None) -> Iterator[ChatProcess]:
    """Start ``python -m msm_mem.testing chat-server`` with ``script`` (replies in their JSON
    form) and ``default``; stop it at the end of the block."""
    folder.mkdir(parents=True, exist_ok=True)
    script_file, record = folder / "script.json", folder / "requests.jsonl"
    script_file.write_text(json.dumps(list(script)), encoding="utf-8")
    cmd = [sys.executable, "-m", "msm_mem.testing", "chat-server", "--script", str(script_file)]
    cmd += ["--record", str(record)]
    if default is not None:
        cmd += ["--default", json.dumps(default)]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with (folder / "chat-server.log").open("w") as log:
        process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    assert process.stdout is not None
    base_url = process.stdout.readline().strip()
    server = ChatProcess(base_url, record, process)
    try:
        started = base_url.startswith("http://127.0.0.1:")
        assert started, f"the chat server did not start: {(folder / 'chat-server.log').read_text()[-2000:]}"
        yield server
    finally:
        server.stop()


def prompt_sent(request: dict[str, Any]) -> str:
    """The text part of the user message of a chat request."""
    content = request["json"]["messages"][-1]["content"]
    return str(content if isinstance(content, str) else content[0]["text"])


def image_sent(request: dict[str, Any]) -> str:
    """The image URL of the user message of a chat request."""
    return str(request["json"]["messages"][-1]["content"][1]["image_url"]["url"])
