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
from pathlib import Path

from ... import AccessDenied, MsmMem, Principal, Role
from ..._private import read_private, write_private
from ...interfaces.auth.apikeys import ApiKeyStore

__all__ = ["ADMIN_KEY_FILE", "ENV_ADMIN_KEY", "issue_admin_key", "require_admin_credential"]

ENV_ADMIN_KEY = "MSM_MEM_ADMIN_KEY"
ADMIN_KEY_FILE = "admin.key"


def require_admin_credential(directory: Path, command: str) -> Principal:
    """The principal of the admin credential in force for the store of ``directory``; AccessDenied
    naming what to set when there is none, or when it is not an admin key of this store."""
    if command == "store upgrade" and (directory / "keys" / "checkpoint.key").is_file():
        return Principal("store-owner", Role.ADMIN)  # a store from before the key home: its key files prove it
    token = os.environ.get(ENV_ADMIN_KEY)
    where = ENV_ADMIN_KEY
    if not token:
        path = MsmMem.key_folder(directory) / ADMIN_KEY_FILE
        data = read_private(path, "the admin credential", missing_ok=True)
        token = None if data is None else data.decode("ascii", "replace").strip()
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
    (mode 0600, never replaced: FileExistsError before any key is made); returns where. A key
    whose file could not be written is revoked again."""
    path = MsmMem.key_folder(directory) / ADMIN_KEY_FILE
    if path.exists():
        raise FileExistsError(f"{path} exists already: an admin credential is never replaced")
    keys = ApiKeyStore.of_store(directory)
    token, record = keys.create(admin, [], note="admin credential of the CLI")
    try:
        write_private(path, (token + "\n").encode("ascii"), replace=False)
    except BaseException:
        keys.revoke(record.key_id)
        raise
    return path
