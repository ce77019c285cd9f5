"""The admin credential of the CLI: what a command reserved to an admin needs besides
``--role admin``.

On the command line a role is attribution (who the audit trail names), except for the
commands that change who may see what or what the store is: consent grant and revoke, key
rotation, shredding, API keys, import, upgrade and the image root. Those need proof of the
admin credential, an API key of role admin of this store that is in force:

* ``MSM_MEM_ADMIN_KEY``: the key itself (``msmk_...``), or
* the key home's ``admin.key`` (mode 0600): written by ``msm-mem init`` (and by ``store
  upgrade`` for a store made before it), beside the store's key files. Whoever holds the key
  home holds the store's keys already; a deployment that gives the key files to services
  moves ``admin.key`` out to its administrators and sets ``MSM_MEM_ADMIN_KEY``.

``store upgrade`` of a store that still keeps its keys inside its directory (made before the
key home, so without an admin credential) accepts those key files as the proof.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ... import AccessDenied, MsmMem, Principal, Role
from ...interfaces.auth.apikeys import ApiKeyStore

__all__ = ["ADMIN_KEY_FILE", "ENV_ADMIN_KEY", "issue_admin_key", "require_admin_credential"]

ENV_ADMIN_KEY = "MSM_MEM_ADMIN_KEY"
ADMIN_KEY_FILE = "admin.key"


def _read_private(path: Path) -> str | None:
    """The text of ``path`` when it is a regular file only its owner may read; None when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AccessDenied(f"the admin credential {path} cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "r", encoding="ascii", errors="replace") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise AccessDenied(f"the admin credential {path} must be a regular file of mode 0600")
        return handle.read(512).strip()


def require_admin_credential(directory: Path, command: str) -> Principal:
    """The principal of the admin credential in force for the store of ``directory``; AccessDenied
    naming what to set when there is none, or when it is not an admin key of this store."""
    if command == "store upgrade" and (directory / "keys" / "checkpoint.key").is_file():
        return Principal("store-owner", Role.ADMIN)  # a store from before the key home: its key files prove it
    token = os.environ.get(ENV_ADMIN_KEY)
    where = ENV_ADMIN_KEY
    if not token:
        path = MsmMem.key_folder(directory) / ADMIN_KEY_FILE
        token = _read_private(path)
        where = str(path)
    if not token:
        raise AccessDenied(
            f"{command} is reserved to an admin and needs the admin credential: set {ENV_ADMIN_KEY} to an admin API"
            f" key of this store (msm-mem keys api-key create ... --role admin), or keep the key home's"
            f" {ADMIN_KEY_FILE}; --role admin alone only names who acts"
        )
    key = ApiKeyStore.of_store(directory).verify(token)
    if key is None or key.role != Role.ADMIN.value:
        raise AccessDenied(f"{where} is not an admin API key of this store in force (unknown, revoked or another role)")
    return key.principal


def issue_admin_key(directory: Path, admin: Principal) -> Path:
    """Make an admin API key acting as ``admin`` and write it to the key home's ``admin.key``
    (mode 0600, never replaced); returns where."""
    path = MsmMem.key_folder(directory) / ADMIN_KEY_FILE
    token, _ = ApiKeyStore.of_store(directory).create(admin, [], note="admin credential of the CLI")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(token + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path
