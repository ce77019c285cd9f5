"""On the command line `--role admin` is attribution; what changes who may see what (consent,
keys, API keys, import, upgrade, the image root) needs the admin credential: the key home's
`admin.key` that init writes, or `MSM_MEM_ADMIN_KEY` (an admin API key in force). Without it
an insider who names themselves admin grants nothing (synthetic data only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from msm_mem import MsmMem, Principal
from msm_mem.interfaces.auth.apikeys import ApiKeyStore
from msm_mem.interfaces.cli.credential import ADMIN_KEY_FILE, ENV_ADMIN_KEY
from tests.cli_support import ADMIN, CLINICIAN, make_store, one_line_error, run

pytestmark = pytest.mark.usefixtures("clean_msm_env")


def _grant(capsys: pytest.CaptureFixture[str], store: Path, *who: str) -> tuple[int, str, str]:
    grant = ("consent", "grant", store, "--patient", "P-1", "--grantee", "actor:mallory", "--purpose", "treatment")
    return run(capsys, *grant, *who)


def _hide_admin_key(store: Path, tmp_path: Path) -> str:
    """Move the key home's admin.key away (to the administrators); returns its token."""
    path = MsmMem.key_folder(store) / ADMIN_KEY_FILE
    token = path.read_text().strip()
    path.rename(tmp_path / "vault-admin.key")
    return token


def test_init_writes_the_admin_credential_beside_the_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """init says where the keys and the credential are; admin.key is 0600 there, not in DIR;
    with it an admin's consent grant works as before."""
    store = tmp_path / "store"
    code, out, _ = run(capsys, "init", store, *ADMIN)
    assert code == 0
    folder = MsmMem.key_folder(store)
    assert str(folder) in out and ADMIN_KEY_FILE in out
    assert (folder / ADMIN_KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert not list(store.rglob(ADMIN_KEY_FILE))
    code, _, err = _grant(capsys, store, *ADMIN)
    assert code == 0, err


def test_a_self_declared_admin_grants_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the credential: --role admin, MSM_MEM_ROLE=admin and a self-made admin API key
    are all refused naming the credential; reads of other roles need none (attribution)."""
    store, _ = make_store(tmp_path)
    _hide_admin_key(store, tmp_path)
    code, _, err = _grant(capsys, store, *ADMIN)
    assert code == 1 and "needs the admin credential" in one_line_error(err)
    monkeypatch.setenv("MSM_MEM_ACTOR", "mallory")
    monkeypatch.setenv("MSM_MEM_ROLE", "admin")
    code, _, err = _grant(capsys, store)
    assert code == 1 and "needs the admin credential" in err
    monkeypatch.delenv("MSM_MEM_ACTOR")
    monkeypatch.delenv("MSM_MEM_ROLE")
    code, _, err = run(capsys, "keys", "api-key", "create", store, "--actor", "mallory", "--role", "admin")
    assert code == 1 and "needs the admin credential" in err
    for argv in (("keys", "rotate", store, "--reason", "x"), ("store", "image-root", store, tmp_path)):
        code, _, err = run(capsys, *argv, *ADMIN)
        assert code == 1 and "needs the admin credential" in err, argv
    code, _, err = run(capsys, "show", "episodes", store, "--patient", "P-1", *CLINICIAN)
    assert code == 0, err
    # an insider who writes an API key file of their own into DIR (where older versions kept it)
    forged, _ = ApiKeyStore(store / "keys" / "api-keys.json").create(Principal("mallory", "admin", "operations"), [])
    monkeypatch.setenv(ENV_ADMIN_KEY, forged)
    code, _, err = _grant(capsys, store, *ADMIN)
    assert code == 1 and "is not an admin API key of this store" in err


def test_the_admin_key_in_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MSM_MEM_ADMIN_KEY with the admin key works; an agent's key, a revoked admin key and a
    malformed one are refused naming the variable."""
    store, _ = make_store(tmp_path)
    token = _hide_admin_key(store, tmp_path)
    monkeypatch.setenv(ENV_ADMIN_KEY, token)
    code, _, err = _grant(capsys, store, *ADMIN)
    assert code == 0, err
    code, agent_key, err = run(capsys, "keys", "api-key", "create", store, "--actor", "agent-1", "--role", "agent")
    assert code == 0, err
    code, second, err = run(capsys, "keys", "api-key", "create", store, "--actor", "admin-2", "--role", "admin")
    assert code == 0, err
    for bad in (agent_key.strip(), "msmk_0000000000000000_nothing", "not a key"):
        monkeypatch.setenv(ENV_ADMIN_KEY, bad)
        code, _, err = _grant(capsys, store, *ADMIN)
        assert code == 1 and f"{ENV_ADMIN_KEY} is not an admin API key" in err, bad
    monkeypatch.setenv(ENV_ADMIN_KEY, second.strip())
    key_id = second.strip().split("_")[1]
    assert run(capsys, "keys", "api-key", "revoke", store, key_id)[0] == 0  # revoking itself, last act
    code, _, err = _grant(capsys, store, *ADMIN)
    assert code == 1 and "revoked" in err
    monkeypatch.setenv(ENV_ADMIN_KEY, token)
    code, _, err = _grant(capsys, store, *ADMIN)
    assert code == 0, err


def test_an_admin_key_file_others_may_read_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """admin.key readable by group or others is not taken as proof."""
    store, _ = make_store(tmp_path)
    path = MsmMem.key_folder(store) / ADMIN_KEY_FILE
    os.chmod(path, 0o644)
    code, _, err = _grant(capsys, store, *ADMIN)
    assert code == 1 and "must not be accessible by group or others" in err


def test_an_admin_credential_is_never_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issuing a second credential where admin.key exists fails before any API key is made."""
    from msm_mem.interfaces.cli.credential import issue_admin_key

    store, _ = make_store(tmp_path)
    keys = ApiKeyStore.of_store(store)
    before = keys.list()
    with pytest.raises(FileExistsError, match="never replaced"):
        issue_admin_key(store, Principal("admin-2", "admin", "operations"))
    assert keys.list() == before
