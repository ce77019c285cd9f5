"""Crash safety: a child writing through the public API is killed with SIGKILL at random points;
after each kill the store opens, every acknowledged write is there exactly once, nothing is
half-written and the chain verifies (a small sample of ``benchmarks/crash_safety.py``, whose
full run and result are in docs/reliability.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import SKIP_POSTGRES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # its modules import each other
import crash_safety  # noqa: E402  (found on the path set just above)

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(sys.platform == "win32", reason="the children are forked and killed with SIGKILL"),
]

#: bounds on each run (the kills are counted; the time only ends a run on a very slow machine)
MAX_SECONDS = 120.0


def _passed(result: crash_safety.Result, kills: int) -> None:
    assert result.failures == [], crash_safety.table([result])
    assert result.kills >= 1 and result.checks == result.kills
    assert result.acknowledged >= 1
    if result.seconds < MAX_SECONDS:
        assert result.kills == kills


def test_killed_writers_lose_nothing_on_the_embedded_store(tmp_path: Path) -> None:
    """12 SIGKILLs of a child writing an embedded store: each check after a kill passes."""
    _passed(crash_safety.run(tmp_path, "sqlite", 12, seed=13, max_seconds=MAX_SECONDS), 12)


@pytest.mark.postgres
@pytest.mark.skipif(SKIP_POSTGRES, reason="MSM_MEM_SKIP_POSTGRES is set")
def test_killed_writers_lose_nothing_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    """4 SIGKILLs of a child writing a PostgreSQL store: each check after a kill passes."""
    _passed(crash_safety.run(tmp_path, "postgres", 4, seed=13, dsn=postgres_url, max_seconds=MAX_SECONDS), 4)


def test_a_kill_right_after_a_shred_commits_leaves_the_key_destroyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data key is destroyed in the transaction that retracts the patient's records: a
    process dying right after that commit (here: the step after it raising) leaves no live key
    behind records the audit trail already calls erased."""
    from msm_mem import ManifestRow, MsmMem
    from msm_mem._governance.crypto import EnvelopeCipher
    from tests.helpers import ADMIN, AGENT, INGEST, png
    from tests.layers import open_layers

    rows = [ManifestRow("P1", f"S{i}", 1.6e9 + i, str(png(tmp_path, i)), "Findings?", "small effusion") for i in (1, 2)]
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        mem.ingest(INGEST, rows)

        def killed(self: EnvelopeCipher, patient_ref: str) -> None:
            raise KeyboardInterrupt("the process dies here")

        with monkeypatch.context() as patched:
            patched.setattr(EnvelopeCipher, "shred", killed)
            with pytest.raises(KeyboardInterrupt):
                mem.shred(ADMIN, "P1", "erasure request")
    with open_layers(tmp_path / "s") as layers:
        assert layers.store.keys().get("P1") is None  # the destroyed key's row keeps no patient id
        key = layers.store.keys().get(layers.cipher.tomb_ref("P1") or "P1")
        assert key is not None and key.shredded and key.wrapped == b""
    with MsmMem.open(tmp_path / "s") as mem:
        assert mem.episodes(AGENT, "P2") == []  # another patient still works
        assert mem.verify_audit(crash_safety.AUDITOR).ok
