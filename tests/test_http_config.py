"""The server's settings: bad values refused with the setting named, the request thread pool
sized as configured."""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient

from msm_mem import InvalidInput, MsmMem
from msm_mem.interfaces.cli import main
from msm_mem.interfaces.http.app import create_app
from msm_mem.interfaces.http.config import ServeConfig
from tests.helpers import ADMIN


@pytest.mark.parametrize("name", ["max_threads", "max_k", "max_page", "max_upload_bytes"])
@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_a_bad_limit_is_refused_by_name(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=name):
        ServeConfig(tmp_path, **{name: value})  # type: ignore[arg-type]


def test_the_request_pool_has_the_configured_threads(tmp_path: Path) -> None:
    """The app's event loop runs blocking request work on at most ``max_threads`` threads."""
    MsmMem.init(tmp_path / "s", ADMIN).close()
    for threads in (3, 11):
        with TestClient(create_app(ServeConfig(tmp_path / "s", max_threads=threads))) as client:
            assert client.portal.call(lambda: anyio.to_thread.current_default_thread_limiter().total_tokens) == threads
            assert client.get("/health").status_code == 200


def test_serve_refuses_a_thread_count_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    MsmMem.init(tmp_path / "s", ADMIN).close()
    assert main(["serve", str(tmp_path / "s"), "--threads", "0"]) != 0
    assert "max_threads must be a positive integer" in capsys.readouterr().err
