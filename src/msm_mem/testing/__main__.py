"""``python -m msm_mem.testing chat-server [--script FILE] [--record FILE] ...``: the fake
OpenAI-compatible chat server as a process of its own (see :mod:`._chat_server`)."""

from __future__ import annotations

import sys

from ._chat_server import main

if __name__ == "__main__":
    if sys.argv[1:2] != ["chat-server"]:
        print("usage: python -m msm_mem.testing chat-server [--script FILE] [--record FILE] [--default JSON]")
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[2:]))
