"""Who a command acts as: the principal (actor, role, purpose) from flags, the environment or
the store's identity file. Precedence, field by field (the first one set wins):

  1. the command's own --actor / --role / --purpose (after the command's name),
  2. the same flags before the command: msm-mem --actor ID --role ROLE COMMAND ...,
  3. the environment: MSM_MEM_ACTOR, MSM_MEM_ROLE, MSM_MEM_PURPOSE,
  4. DIR/identity.json, written by msm-mem init: the admin who initialised the store.

An actor named by a flag or the environment needs its role named too; only the store's
configured identity (identity.json) acts in the command's default role, shown in each
command's --help. With no purpose named, a command uses its own where it has one (export,
erasure, audit), else the role's usual one (treatment for agent, clinician and critic;
operations for system and admin; audit for auditor). With no identity at all a command fails,
naming these flags. Commands that create a store (init, import into a new DIR) act as an
admin: by default the OS user name.

A role named here is attribution: it says whom the audit trail names. The commands that
change who may see what or what the store is (consent grant/revoke, keys rotate/shred,
keys api-key create/revoke, import, store upgrade, store image-root) also need the admin
credential: MSM_MEM_ADMIN_KEY (an admin API key of the store), else the key home's admin.key,
which init writes beside the store's keys (mode 0600).
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ... import InvalidInput, Principal, Purpose, Role
from ..._principal import as_role

__all__ = [
    "ACTOR_ENV",
    "IDENTITY_FILE",
    "PURPOSE_ENV",
    "ROLE_ENV",
    "Given",
    "read_identity",
    "resolve",
    "write_identity",
]

ACTOR_ENV, ROLE_ENV, PURPOSE_ENV = "MSM_MEM_ACTOR", "MSM_MEM_ROLE", "MSM_MEM_PURPOSE"
IDENTITY_FILE = "identity.json"

#: the purpose a role acts for when neither the caller nor the command names one
USUAL_PURPOSE: Mapping[Role, Purpose] = {
    Role.AGENT: Purpose.TREATMENT,
    Role.CLINICIAN: Purpose.TREATMENT,
    Role.CRITIC: Purpose.TREATMENT,
    Role.SYSTEM: Purpose.OPERATIONS,
    Role.ADMIN: Purpose.OPERATIONS,
    Role.AUDITOR: Purpose.AUDIT,
}

_ROLES = ", ".join(r.value for r in Role)
NO_IDENTITY = (
    "no acting principal: give --actor ID --role ROLE [--purpose PURPOSE], set MSM_MEM_ACTOR and "
    f"MSM_MEM_ROLE, or use a store made by `msm-mem init` (its {IDENTITY_FILE}); roles: {_ROLES}"
)


@dataclass(frozen=True, slots=True)
class Given:
    """What the caller named (flags, then the environment); None where nothing was."""

    actor: str | None = None
    role: str | None = None
    purpose: str | None = None

    @classmethod
    def of(cls, *sources: Mapping[str, str | None]) -> Given:
        """The first non-empty value of each field over ``sources`` (highest precedence first)."""

        def first(name: str) -> str | None:
            for source in sources:
                value = source.get(name)
                if value is not None and value.strip():
                    return value.strip()
            return None

        return cls(first("actor"), first("role"), first("purpose"))


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The principal fields the environment sets (MSM_MEM_ACTOR/_ROLE/_PURPOSE), as a source
    for :meth:`Given.of`."""
    env = os.environ if environ is None else environ
    return {"actor": env.get(ACTOR_ENV), "role": env.get(ROLE_ENV), "purpose": env.get(PURPOSE_ENV)}


def read_identity(directory: Path) -> str | None:
    """The actor id recorded in ``directory``'s identity file, None when there is none."""
    path = directory / IDENTITY_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
        actor = doc["actor"]
        Principal(actor, doc["role"])  # the same checks as any principal
    except (ValueError, KeyError, TypeError, InvalidInput) as exc:
        raise InvalidInput(f"{path} is not a valid identity file ({exc}); give --actor and --role") from None
    return str(actor)


def write_identity(directory: Path, principal: Principal) -> Path:
    """Record ``principal`` as the store's configured identity (mode 0600, replacing any)."""
    path = directory / IDENTITY_FILE
    doc = {
        "actor": principal.id,
        "role": principal.role.value,
        "initialised_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    return path


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError) as exc:  # no login name and no USER/LOGNAME variable
        raise InvalidInput(f"cannot tell the OS user name ({exc}): give --actor ID") from None


def resolve(
    given: Given,
    directory: Path | None,
    *,
    role: Role,
    purpose: Purpose | None = None,
    creates_store: bool = False,
) -> Principal:
    """The acting principal of one command (see the module docstring for the precedence).

    ``role`` is the command's default role for the configured identity, ``purpose`` its own
    purpose (None: the role's usual one); ``creates_store`` makes the OS user the default
    actor, as the admin who creates the store. Unknown roles or purposes are InvalidInput
    naming the allowed values."""
    actor, role_name = given.actor, given.role
    if actor is None:
        actor = read_identity(directory) if directory is not None else None
        if actor is None:
            if not creates_store:
                raise InvalidInput(NO_IDENTITY)
            actor = _os_user()
        if role_name is None:
            role_name = role.value
    elif role_name is None:
        if not creates_store:
            raise InvalidInput(f"actor {actor!r} needs a role too: give --role ROLE or set {ROLE_ENV} ({_ROLES})")
        role_name = role.value
    who = Principal(actor, as_role(role_name))  # InvalidInput for an unknown role or a malformed id
    if given.purpose is not None:
        return who.acting_for(given.purpose)
    return who.acting_for(purpose or USUAL_PURPOSE[who.role])
