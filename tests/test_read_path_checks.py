"""The checks of the read path that were made cheaper keep refusing what they refused: a field
token's strict base64url decoding, the codec's refusal of plain text, and the checkpoint line
written once per commit."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem._errors import DecryptionError
from msm_mem._governance.audit.checkpoint import Checkpoint
from msm_mem._governance.audit.checkpoint_files import publish, read_head, read_tail, write_head
from msm_mem._governance.crypto import EnvelopeCipher, _b64url, _unb64url
from msm_mem._governance.envelope_codec import EnvelopeCodec
from msm_mem.testing import InMemoryKeyProvider, InMemoryWrappedKeyStore

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _reference(text: str) -> bytes:
    """The decoding before: lenient decoding, then refused unless encoding gives ``text`` back."""
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64url(data) != text:
        raise ValueError("non-canonical base64url")
    return data


def _outcome(fn: object, text: str) -> bytes | None:
    try:
        return fn(text)  # type: ignore[operator,no-any-return]
    except ValueError:  # binascii.Error is a ValueError
        return None


@given(st.binary(max_size=200))
def test_decoding_inverts_encoding(data: bytes) -> None:
    """Every encoded payload decodes to its bytes."""
    assert _unb64url(_b64url(data)) == data


@given(st.one_of(st.text(alphabet=ALPHABET, max_size=40), st.text(alphabet=ALPHABET + "+/=. \n\x00é", max_size=40)))
def test_decoding_refuses_what_the_reference_refuses(text: str) -> None:
    """Any text: refused exactly when the re-encoding check refused it, else the same bytes
    (set unused trailing bits, a dangling character, padding, the standard alphabet, spaces)."""
    assert _outcome(_unb64url, text) == _outcome(_reference, text)


@pytest.mark.parametrize("text", ["QR", "QUJ", "A", "QQ==", "Q+8", "Q/8", " QQ", "QQ\n", "QQ."])
def test_malleable_or_foreign_payloads_are_refused(text: str) -> None:
    """Unused bits set (``QR``, ``QUJ``), a lone character, padding and foreign characters."""
    with pytest.raises(ValueError):
        _unb64url(text)


def _codec() -> tuple[EnvelopeCodec, EnvelopeCipher]:
    keys = InMemoryWrappedKeyStore()
    cipher = EnvelopeCipher("t1", InMemoryKeyProvider(), keys, lambda: 42.0)
    return EnvelopeCodec(cipher, keys), cipher


def test_the_codec_refuses_plain_text_naming_the_field() -> None:
    """A field holding plain text (or anything but a token) is refused with the field named."""
    codec, _ = _codec()
    for value in ("Stable nodule", "enc1:K-1:abc", "", "enc1:"):
        with pytest.raises(DecryptionError, match=r"episodic\.answer of E-1 is not an encrypted token"):
            codec.decode("episodic", "E-1", "answer", "P1", value)


def test_the_codec_still_refuses_a_token_moved_or_altered() -> None:
    """A well-formed token of another record, or one byte changed, fails authentication."""
    codec, cipher = _codec()
    token = codec.encode("episodic", "E-1", "answer", "P1", "Stable nodule")
    assert codec.decode("episodic", "E-1", "answer", "P1", token) == "Stable nodule"
    with pytest.raises(DecryptionError, match="authentication failed"):
        codec.decode("episodic", "E-2", "answer", "P1", token)
    head, payload = token.rsplit(":", 1)
    flipped = ALPHABET[(ALPHABET.index(payload[5]) + 1) % 64]
    with pytest.raises(DecryptionError):
        codec.decode("episodic", "E-1", "answer", "P1", f"{head}:{payload[:5]}{flipped}{payload[6:]}")
    with pytest.raises(DecryptionError, match="another patient|this patient"):
        cipher.decrypt_field("P2", "episodic", "E-1", "answer", token)


def _checkpoint(size: int, signature: str) -> Checkpoint:
    return Checkpoint("store-1", size, os.urandom(32).hex(), 1_700_000_000.0 + size, signature, 0, "0" * 64)


def test_each_checkpoint_file_gets_its_own_checkpoint(tmp_path: Path) -> None:
    """The head file, the log and a witness hold each commit's own checkpoint, line for line,
    however many are written in turn (the line of the last few is made once)."""
    log, witness, head = tmp_path / "audit" / "c.jsonl", tmp_path / "w" / "c.jsonl", tmp_path / "audit" / "c.head"
    written = [_checkpoint(n, f"{n:0128x}") for n in range(1, 12)]
    for cp in written:
        write_head(head, cp)
        publish(log, cp)
        publish(witness, cp)
        assert read_head(head) == cp
        assert read_tail(log) == cp
    expected = b"".join(cp.to_json() + b"\n" for cp in written)
    assert log.read_bytes() == expected
    assert witness.read_bytes() == expected


def test_equal_checkpoints_differing_in_one_field_get_their_own_lines(tmp_path: Path) -> None:
    """Two checkpoints alike but for the signature are two lines, each its own."""
    a = _checkpoint(5, "a" * 128)
    b = Checkpoint(a.origin, a.size, a.head_hash, a.time, "b" * 128, a.base_size, a.base_hash)
    log = tmp_path / "c.jsonl"
    publish(log, a)
    publish(log, b)
    assert log.read_bytes() == a.to_json() + b"\n" + b.to_json() + b"\n"


def test_the_head_file_is_rewritten_in_place_to_the_new_line(tmp_path: Path) -> None:
    """A shorter head after a longer one leaves exactly the new line; a write cut off before
    the file was shortened (the new line, then the old one's tail) reads as no head."""
    head = tmp_path / "audit" / "c.head"
    long, short = _checkpoint(10**9, "a" * 128), _checkpoint(7, "b" * 128)
    assert len(long.to_json()) > len(short.to_json())
    write_head(head, long)
    write_head(head, short)
    assert head.read_bytes() == short.to_json() + b"\n"
    assert read_head(head) == short
    old = long.to_json() + b"\n"
    new = short.to_json() + b"\n"
    head.write_bytes(new + old[len(new) :])  # what a crash between the write and the cut leaves
    assert read_head(head) is None
    write_head(head, long)
    assert read_head(head) == long
    assert head.stat().st_mode & 0o777 == 0o600


def test_an_append_the_disk_refuses_halfway_leaves_the_log_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk that takes part of a checkpoint line and refuses the rest raises, and the
    log keeps its earlier lines only (no torn line a later append would have to cut)."""
    log = tmp_path / "audit" / "c.jsonl"
    first = _checkpoint(1, "a" * 128)
    publish(log, first)
    real_write = os.write

    def partial(fd: int, data: bytes) -> int:
        if len(data) > 20:
            return real_write(fd, data[:20])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", partial)
    with pytest.raises(OSError):
        publish(log, _checkpoint(2, "b" * 128))
    monkeypatch.undo()
    assert log.read_bytes() == first.to_json() + b"\n"
    assert read_tail(log) == first
