"""Tests of msm_mem._storage.location: which store of record a memory directory names (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msm_mem._api.mem import MsmMem
from msm_mem._errors import InvalidInput, StoreError
from msm_mem._storage.location import (
    LOCATION_FILE,
    ServerLocation,
    is_store,
    read_location,
    without_password,
)
from msm_mem._tier_records import ConsentRecord
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedClock
from tests.helpers import ADMIN


def _write(directory: Path, spec: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCATION_FILE
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec), encoding="utf-8")
    return path


def test_embedded_store_has_no_server_location(tmp_path: Path) -> None:
    """An initialised embedded store reads as None; a plain directory is no store."""
    MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(1.7e9)).close()
    assert is_store(tmp_path / "s") and read_location(tmp_path / "s") is None
    assert not is_store(tmp_path)
    with pytest.raises(StoreError, match="not an msm-mem store"):
        read_location(tmp_path)


def test_server_location_round_trip(tmp_path: Path) -> None:
    """A well-formed store.json gives its DSN and schema (schema defaults to msm_mem)."""
    _write(tmp_path, {"backend": "postgresql", "dsn": "host=db dbname=clinic", "schema": "ward_7"})
    assert read_location(tmp_path) == ServerLocation("host=db dbname=clinic", "ward_7")
    _write(tmp_path, {"backend": "postgresql", "dsn": "host=db"})
    assert read_location(tmp_path) == ServerLocation("host=db", "msm_mem")


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("{not json", "not readable JSON"),
        ([1, 2], "backend must be 'postgresql'"),
        ({"backend": "mysql", "dsn": "host=db"}, "backend must be 'postgresql', got 'mysql'"),
        ({"backend": "postgresql", "dsn": "host=db", "password": "x"}, "unknown keys \\['password'\\]"),
        ({"backend": "postgresql"}, "'dsn' and 'schema' must be strings"),
        ({"backend": "postgresql", "dsn": "  "}, "non-empty"),
        ({"backend": "postgresql", "dsn": "host=db", "schema": "Drop Table"}, "schema name"),
        ({"backend": "postgresql", "dsn": "host=db", "schema": 7}, "must be strings"),
    ],
)
def test_malformed_store_json_is_refused_by_name(tmp_path: Path, spec: object, problem: str) -> None:
    """Every malformed store.json raises StoreError naming the file and the problem."""
    path = _write(tmp_path, spec)
    with pytest.raises(StoreError, match=problem) as info:
        read_location(tmp_path)
    assert str(path) in str(info.value)


def test_both_kinds_in_one_directory_are_refused(tmp_path: Path) -> None:
    """A directory holding a SQLite store and a store.json is ambiguous: refused, and init too."""
    MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(1.7e9)).close()
    _write(tmp_path / "s", {"backend": "postgresql", "dsn": "host=db"})
    with pytest.raises(StoreError, match="holds both"):
        MsmMem.open(tmp_path / "s")
    with pytest.raises(StoreError, match="already holds a store"):
        MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(1.7e9))


def test_init_refuses_a_directory_pointing_at_a_server(tmp_path: Path) -> None:
    """init does not overwrite a store.json: the directory already names a store."""
    path = _write(tmp_path / "s", {"backend": "postgresql", "dsn": "host=db"})
    with pytest.raises(StoreError, match="already holds a store"):
        MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(1.7e9))
    assert json.loads(path.read_text())["dsn"] == "host=db"
    assert not (tmp_path / "s" / "msm-mem.sqlite").exists()


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://msm:s3cret@db.internal:5433/clinic?sslmode=require",
        "host=db.internal port=5433 dbname=clinic user=msm password=s3cret sslmode=require",
    ],
)
def test_without_password_drops_only_the_password(dsn: str) -> None:
    """URL and key=value DSNs lose their password and keep every other parameter."""
    from psycopg.conninfo import conninfo_to_dict

    stripped = without_password(dsn)
    assert "s3cret" not in stripped
    assert conninfo_to_dict(stripped) == {
        "host": "db.internal",
        "port": "5433",
        "dbname": "clinic",
        "user": "msm",
        "sslmode": "require",
    }


def test_bad_database_url_and_schema_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    """init with a malformed URL or schema name raises InvalidInput and creates nothing."""
    with pytest.raises(InvalidInput, match="connection string"):
        MsmMem.init(tmp_path / "a", ADMIN, database_url="postgresql://[bad", clock=FixedClock(1.7e9))
    with pytest.raises(InvalidInput, match="schema name"):
        MsmMem.init(tmp_path / "b", ADMIN, database_url="host=db", schema="1abc", clock=FixedClock(1.7e9))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_schema_needs_database_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--schema alone is a mistake (it would be ignored): refused, nothing created."""
    assert main(["init", str(tmp_path / "m"), "--schema", "ward"]) == 1
    assert "--database-url" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_database_url_does_not_apply_to_an_embedded_store(tmp_path: Path) -> None:
    """Opening an embedded store with a database URL is a mistake, refused by name."""
    MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(1.7e9)).close()
    with pytest.raises(InvalidInput, match="embedded store"):
        MsmMem.open(tmp_path / "s", database_url="host=db")


def test_a_failing_undo_does_not_hide_why_init_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When init fails and undoing it fails too, the first error is raised, with a note."""
    import msm_mem._api.mem as api

    def broken(*args: object) -> None:
        raise OSError("disk went read-only")

    monkeypatch.setattr(api, "remove_new_store", broken)
    bad = ConsentRecord("C-1", "P1", "role:agent", "treatment", "permit", ("no-such-class",), 0.0)
    with pytest.raises(InvalidInput) as info:
        MsmMem.init(tmp_path / "s", ADMIN, policy=[bad], clock=FixedClock(1.7e9))
    assert any("disk went read-only" in note for note in info.value.__notes__)
