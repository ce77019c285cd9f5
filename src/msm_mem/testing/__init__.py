"""Fakes shipped with the package so that examples and tests run without weights or servers.

- :class:`FixedClock`: a clock that only moves when told (TTL, decay and freshness tests).
- :class:`DeterministicEncoder`: maps an image to a unit vector seeded by its pixel bytes, so
  equal images give equal vectors and different images nearly orthogonal ones; no weights.
- :class:`FixedBackbone`: answers every prompt with the same text and decision, so a test
  controls what the write-back gate and the audit see; no model.
- :class:`FakeChatServer`: a scripted OpenAI-compatible chat-completions server on
  ``127.0.0.1`` (replies from :class:`FakeReply`, requests kept as :class:`RecordedRequest`),
  to exercise the ``openai`` backbone over real HTTP without a model or a network.
- :class:`InMemoryKeyProvider` and :class:`InMemoryWrappedKeyStore`: envelope encryption keys
  held in process memory, nothing on disk.
- :func:`local_server`: a throwaway local PostgreSQL server with pgvector (Unix socket only).

Nothing in the package imports this module: it is for tests and examples only.
"""

from .._clock import FixedClock
from ._chat_server import FakeChatServer, FakeReply, RecordedRequest, completion
from ._fakes import DeterministicEncoder, FixedBackbone
from ._keys import InMemoryKeyProvider, InMemoryWrappedKeyStore
from ._pgserver import local_server

__all__ = [
    "DeterministicEncoder",
    "FakeChatServer",
    "FakeReply",
    "FixedBackbone",
    "FixedClock",
    "InMemoryKeyProvider",
    "InMemoryWrappedKeyStore",
    "RecordedRequest",
    "completion",
    "local_server",
]
