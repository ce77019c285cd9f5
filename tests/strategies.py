"""Hypothesis strategies in one place: hostile input (image files and manifest rows), audit
events of every shape the chain must hold, and the small fixed pools of the model-based test.

The model-based test (``tests/test_model.py``) draws from small, fixed pools so that the
write-back gate's outcome is known in advance: images are random-noise PNGs (one per seed;
two different seeds are far apart under any encoder, the same seed is cosine 1), and every
answer's length and clinical keyword are stated here, next to the text.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from typing import Any

import numpy as np
from hypothesis import strategies as st
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage

from msm_mem import Purpose, Role
from msm_mem._governance.audit.jcs import MAX_SAFE_INTEGER

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk with its length and CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_declaring(width: int, height: int, *, bit_depth: int = 8, colour: int = 0, idat: bytes = b"") -> bytes:
    """A PNG whose header declares ``width`` x ``height`` with only a few bytes of pixel data:
    the size is a claim, nothing of that size is allocated."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    body = idat or zlib.compress(b"\x00" * 16)
    return PNG_SIGNATURE + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", body) + png_chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int, components: int = 1) -> bytes:
    """A JPEG start-of-frame declaring ``width`` x ``height``, without any scan data."""
    comps = b"".join(bytes([i + 1, 0x11, 0]) for i in range(components))
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 8 + 3 * components, 8, height, width, components) + comps
    return b"\xff\xd8" + sof + b"\xff\xd9"


def dicom_declaring(rows: int, columns: int, frames: int = 1, pixel_bytes: int = 32) -> bytes:
    """A DICOM file declaring rows x columns (x frames) but holding only ``pixel_bytes`` of pixel data."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = "1.2.3.4"
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = "1.2.3.4"
    ds.Rows, ds.Columns = rows, columns
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 16
    ds.HighBit = 15
    ds.PixelRepresentation = 0
    if frames > 1:
        ds.NumberOfFrames = frames
    ds.PixelData = b"\x00" * pixel_bytes
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def _valid_files() -> list[bytes]:
    arr = (np.arange(24 * 24) % 251).astype(np.uint8).reshape(24, 24)
    out = []
    for fmt in ("PNG", "JPEG"):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format=fmt)
        out.append(buf.getvalue())
    out.append(dicom_declaring(24, 24, pixel_bytes=24 * 24 * 2))
    return out


VALID_FILES = _valid_files()


def _overwrite(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for position, value in edits:
        out[position % len(out)] = value
    return bytes(out)


#: a valid PNG, JPEG or DICOM cut short, or with some of its bytes overwritten
damaged_files = st.one_of(
    st.tuples(st.sampled_from(VALID_FILES), st.floats(0.0, 1.0)).map(lambda t: t[0][: int(len(t[0]) * t[1])]),
    st.builds(
        _overwrite,
        st.sampled_from(VALID_FILES),
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    ),
)

_dims = st.integers(0, 2**32 - 1) | st.integers(0, 70_000)

#: headers that declare sizes from empty to absurd, with little or no pixel data behind them
declared_sizes = st.one_of(
    st.builds(
        png_declaring,
        _dims,
        _dims,
        bit_depth=st.sampled_from([1, 2, 4, 8, 16, 3]),
        colour=st.sampled_from([0, 2, 3, 4, 6, 5]),
        idat=st.binary(max_size=64),
    ),
    st.builds(jpeg_declaring, st.integers(0, 65_535), st.integers(0, 65_535), st.sampled_from([1, 3, 4])),
    st.builds(dicom_declaring, st.integers(0, 65_535), st.integers(0, 65_535), st.integers(1, 1000)),
)

#: any bytes, bytes behind a real signature, damaged real files, and lying headers
image_bytes = st.one_of(
    st.binary(max_size=600),
    st.tuples(st.sampled_from([PNG_SIGNATURE, b"\xff\xd8\xff", b"\x00" * 128 + b"DICM"]), st.binary(max_size=400)).map(
        lambda t: t[0] + t[1]
    ),
    damaged_files,
    declared_sizes,
)


def _json_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)


#: every JSON value, nested a little
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30), _json_containers, max_leaves=12
)

COLUMNS = (
    "patient_id",
    "study_id",
    "timestamp",
    "image",
    "question",
    "answer",
    "report",
    "decision",
    "view",
    "question_type",
)

#: manifest objects: the real columns (and some others) holding any JSON value
manifest_objects = st.dictionaries(
    st.sampled_from(COLUMNS) | st.text(max_size=8), json_values | st.text(max_size=40), max_size=10
)

#: JSONL lines: arbitrary objects, arbitrary JSON values, deep nesting and raw text
jsonl_lines = st.one_of(
    manifest_objects.map(json.dumps),
    json_values.map(json.dumps),
    st.integers(1, 5_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 5_000).map(lambda n: '{"patient_id": ' + "[" * n + "]" * n + "}"),
    st.text(max_size=80).filter(lambda t: "\n" not in t and "\r" not in t),
)


# audit events --------------------------------------------------------------------------------

#: characters that stress canonical JSON: quotes, backslashes, every escaped control, U+007F,
#: the JavaScript line separators, non-ASCII and astral code points (above U+FFFF)
_JSON_HARD = '"\\/\x00\x07\x08\t\n\x0b\x0c\r\x1f\x7f\x80\u00e9\u2028\u2029\ufeff\uffff\U0001f600\U0010ffff'

#: text an audit field may hold: any code point but a lone surrogate, empty text included
audit_texts = st.text(st.characters(codec="utf-8") | st.sampled_from(_JSON_HARD), max_size=12)

#: ids as msm-mem makes them (``E-0001``, ``pt-<hex>``) and any other text
audit_ids = st.from_regex(r"[A-Za-z]{1,3}-[0-9a-f]{1,24}", fullmatch=True) | audit_texts

#: the times an event may carry, UTC seconds: finite floats of every magnitude except those that
#: canonical JSON writes as integers beyond 2**53 - 1 (refused: no reader keeps them exact),
#: integers within 2**53 - 1, and the boundaries of the number forms
audit_times = st.one_of(
    st.floats(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    st.floats(min_value=1e21, allow_infinity=False),
    st.floats(max_value=-1e21, allow_infinity=False),
    st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    st.sampled_from([0.0, -0.0, 5e-324, 1e-7, 1e-6, 0.1, 1e15, float(MAX_SAFE_INTEGER), 1e21, -1e21, 1.7e9]),
)

#: the fields a caller gives an event (``ChainBuilder.next_row``); role and purpose as the enums
#: or as any text, since both store the same bytes
audit_event_fields = st.fixed_dictionaries(
    {
        "time": audit_times,
        "actor": audit_ids.filter(bool),
        "role": st.sampled_from(list(Role)) | audit_texts,
        "action": st.sampled_from(["read", "write", "transition", "consent", "purge_expired"])
        | audit_texts.filter(bool),
        "source_tier": st.sampled_from(["stm", "ltm", "audit", ""]) | audit_texts,
        "target_tier": st.sampled_from(["stm", "ltm", "audit", ""]) | audit_texts,
        "purpose": st.sampled_from(list(Purpose)) | audit_texts,
        "outcome": st.sampled_from(["success", "denied", "error"]),
        "record_ids": st.lists(audit_ids, max_size=4),
        "patient": st.sampled_from(["", "*"]) | audit_ids,
        "consent_id": st.just("") | audit_ids,
        "reason": audit_texts,
    }
)

#: every field of a stored payload: an event's fields, its ``seq`` and the ``prev_hash`` it links to
audit_payload_fields = st.builds(
    lambda fields, seq, prev: {**fields, "seq": seq, "prev_hash": prev},
    audit_event_fields,
    st.integers(1, 10**15 - 1) | st.integers(1, MAX_SAFE_INTEGER),  # 16 digits leave the fast path
    st.text("0123456789abcdef", min_size=64, max_size=64),
)

# the model-based test's pools ---------------------------------------------------------------

#: the patients of the model (few, so that rules meet the same patient again)
PATIENTS = ("P1", "P2", "P3")
#: image seeds: the same seed twice is not novel for a patient, two seeds always are
IMAGES = (0, 1, 2, 3)
#: study ids, each with its own UTC time (every interaction of a study shares it)
STUDIES = ("S1", "S2", "S3")

#: answers and whether each passes the gate's substance and relevance criteria (at least 3
#: words and a clinical keyword of the packaged lexicon); novelty is the image's business
ANSWERS: dict[str, bool] = {
    "Right lower lobe consolidation with a small effusion.": True,  # 8 words, 3 keywords
    "Lungs are clear, no pneumothorax.": True,  # 5 words, 2 keywords
    "Consolidation.": False,  # a keyword, but 1 word
    "Looks about the same.": False,  # 4 words, no keyword
}
#: a critic's corrections (the text of a rejecting verdict)
CORRECTIONS = ("Left basal effusion, improving.", "No acute cardiopulmonary process.")

#: how far the clock moves in one rule, in seconds: a minute, past the age threshold of a held
#: item (1 h), past the STM lifetime (1 day), and spans that reach the decay of semantic versions
#: (645 to 778 days) and of agent, critic and ground-truth records (1040 to 1578 days)
ADVANCES = (60.0, 2 * 3600.0, 2 * 86400.0, 200 * 86400.0, 700 * 86400.0, 1100 * 86400.0, 1600 * 86400.0)

#: roles whose per-patient treatment consent the model grants and revokes
CONSENT_ROLES = ("agent", "clinician", "critic")

patients = st.sampled_from(PATIENTS)
images = st.sampled_from(IMAGES)
studies = st.sampled_from(STUDIES)
answers = st.sampled_from(sorted(ANSWERS))
corrections = st.sampled_from(CORRECTIONS)
advances = st.sampled_from(ADVANCES)
consent_roles = st.sampled_from(CONSENT_ROLES)
#: manifest rows of one ingest: (patient, study, image, answer)
ingest_rows = st.lists(st.tuples(patients, studies, images, answers), min_size=1, max_size=3)
