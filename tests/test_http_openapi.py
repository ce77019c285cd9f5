"""The served OpenAPI schema is the committed docs/openapi.json, every error class has one
problem type, and the API keys are stored as hashes only."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

import msm_mem
from msm_mem import InvalidInput, MsmMemError, Principal
from msm_mem._client import decode
from msm_mem._problems import LIBRARY, PROBLEMS, problem_for
from msm_mem.interfaces.auth.apikeys import ApiKeyStore, parse_patients
from msm_mem.interfaces.cli import main
from msm_mem.interfaces.http.app import openapi_document

DOC = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"


def test_committed_schema_matches_the_served_one() -> None:
    """docs/openapi.json is what the server serves (regenerate it with
    `python -m msm_mem.interfaces.http.app > docs/openapi.json`)."""
    assert json.loads(DOC.read_text(encoding="utf-8")) == json.loads(json.dumps(openapi_document()))


def test_every_error_class_has_one_stable_problem_type() -> None:
    """Each exception class of the library maps to a problem of its own, the types are unique,
    and the client decodes each problem back into the same class."""
    classes = [getattr(msm_mem, n) for n in msm_mem.__all__]
    errors = [c for c in classes if isinstance(c, type) and issubclass(c, MsmMemError)]
    assert {p.error for p in LIBRARY} == set(errors) - {MsmMemError}  # the base answers as internal-error
    assert len({p.type for p in PROBLEMS}) == len(PROBLEMS)
    for p in LIBRARY:
        doc = {"type": p.type, "title": p.title, "status": p.status, "detail": "d"}
        assert type(decode.error(p.status, doc)) is p.error
    assert problem_for(ValueError("x")).slug == "internal-error"
    assert type(decode.error(500, {"type": "urn:other"})) is MsmMemError


def test_api_keys_are_stored_as_argon2_hashes_in_a_private_file(tmp_path: Path) -> None:
    """A created key verifies, its secret is nowhere in the file (mode 0600), a wrong secret or
    a revoked key does not verify."""
    keys = ApiKeyStore(tmp_path / "api-keys.json")
    token, record = keys.create(Principal("a1", "agent", "treatment"), ["P1", "P2"])
    text = keys.path.read_text()
    secret = token.split("_", 2)[2]  # the secret itself may hold "_" (URL-safe base64)
    assert secret not in text and "$argon2id$" in text
    assert stat.S_IMODE(keys.path.stat().st_mode) == 0o600
    assert keys.verify(token) == record and record.covers("P1") and not record.covers("P3")
    assert keys.verify(token[:-3] + "xyz") is None
    keys.revoke(record.key_id)
    assert keys.verify(token) is None
    assert parse_patients("*") == ("*",) and parse_patients("") == ()
    with pytest.raises(InvalidInput):
        parse_patients("P1,P *")


def test_the_api_key_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys api-key create prints the key once, list shows no hash, revoke revokes."""
    assert main(["init", str(tmp_path / "m"), "--actor", "owner"]) == 0
    capsys.readouterr()
    args = ["keys", "api-key", "create", str(tmp_path / "m"), "--actor", "a1", "--role", "agent", "--patients", "P1"]
    assert main(args) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("msmk_")
    assert main(["keys", "api-key", "list", str(tmp_path / "m")]) == 0
    keys = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(k["actor"], k["role"]) for k in keys] == [("owner", "admin"), ("a1", "agent")]  # init's credential first
    listed = keys[1]
    assert "hash" not in listed and listed["patients"] == ["P1"]
    assert main(["keys", "api-key", "revoke", str(tmp_path / "m"), listed["key_id"]]) == 0
    assert ApiKeyStore.of_store(tmp_path / "m").verify(token) is None
