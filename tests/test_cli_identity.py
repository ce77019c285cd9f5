"""Tests of who a CLI command acts as (msm_mem.interfaces.cli.identity): flags, global flags,
the environment and the store's identity file, in that order; no identity, no command."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from msm_mem import InvalidInput, MsmMem, Principal, Purpose, Role
from msm_mem.interfaces.cli.identity import IDENTITY_FILE, Given, read_identity, resolve, write_identity
from tests.cli_support import ADMIN, ADMIN_P, audit_trail, one_line_error, run

#: settings and identity come from MSM_MEM_* variables: every test starts without any
pytestmark = pytest.mark.usefixtures("clean_msm_env")


@pytest.fixture
def configured(tmp_path: Path) -> Path:
    """A directory whose identity file names alice (the store itself is not needed here)."""
    write_identity(tmp_path, Principal("alice", Role.ADMIN))
    return tmp_path


# resolve --------------------------------------------------------------------------------------


def test_flags_beat_global_flags_beat_environment_beat_identity_file(configured: Path) -> None:
    """Each field comes from the first source that sets it: command flags, global flags, env."""
    env = {"actor": "eve", "role": "clinician", "purpose": "research"}
    glob = {"actor": "gus", "role": "critic", "purpose": None}
    own = {"actor": "olga", "role": None, "purpose": None}
    who = resolve(Given.of(own, glob, env), configured, role=Role.AGENT)
    assert who == Principal("olga", Role.CRITIC, Purpose.RESEARCH)
    assert resolve(Given.of({}, env), configured, role=Role.AGENT) == Principal("eve", Role.CLINICIAN, Purpose.RESEARCH)
    assert resolve(Given.of({}, {}), configured, role=Role.AGENT) == Principal("alice", Role.AGENT, Purpose.TREATMENT)


def test_empty_values_count_as_unset(configured: Path) -> None:
    """An empty or blank variable or flag does not hide the next source."""
    who = resolve(Given.of({"actor": "", "role": "  "}, {"actor": None}), configured, role=Role.SYSTEM)
    assert who == Principal("alice", Role.SYSTEM, Purpose.OPERATIONS)


def test_identity_file_takes_the_command_default_role_and_purpose(configured: Path) -> None:
    """The configured identity acts in the command's default role, for the command's own purpose
    or else the role's usual one; a role named by the caller still wins."""
    assert resolve(Given(), configured, role=Role.ADMIN, purpose=Purpose.ERASURE).purpose is Purpose.ERASURE
    assert resolve(Given(), configured, role=Role.SYSTEM).purpose is Purpose.OPERATIONS
    auditor = resolve(Given(role="auditor"), configured, role=Role.ADMIN)
    assert auditor == Principal("alice", Role.AUDITOR, Purpose.AUDIT)


def test_a_named_actor_needs_a_named_role(configured: Path) -> None:
    """An actor from flags or the environment gets no default role: the error names --role."""
    with pytest.raises(InvalidInput, match="--role ROLE or set MSM_MEM_ROLE"):
        resolve(Given(actor="bob"), configured, role=Role.AGENT)


def test_no_identity_at_all_names_the_flags(tmp_path: Path) -> None:
    """Without flags, environment or identity file the error names the flags and variables."""
    with pytest.raises(InvalidInput) as info:
        resolve(Given(), tmp_path, role=Role.AGENT)
    for needle in ("--actor ID", "--role ROLE", "MSM_MEM_ACTOR", "identity.json"):
        assert needle in str(info.value)
    with pytest.raises(InvalidInput):  # a role alone is no identity
        resolve(Given(role="agent"), tmp_path, role=Role.AGENT)


def test_creating_a_store_defaults_to_the_os_user_as_admin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that creates the store acts as the OS user name with role admin by default."""
    monkeypatch.setenv("LOGNAME", "os-user")
    who = resolve(Given(), tmp_path, role=Role.ADMIN, creates_store=True)
    assert who == Principal("os-user", Role.ADMIN, Purpose.OPERATIONS)
    assert resolve(Given(actor="carol"), tmp_path, role=Role.ADMIN, creates_store=True).role is Role.ADMIN


@pytest.mark.parametrize(
    ("given", "message"), [(Given("bob", "nurse"), "unknown role"), (Given("bob", "agent", "fun"), "unknown purpose")]
)
def test_unknown_roles_and_purposes_are_refused(tmp_path: Path, given: Given, message: str) -> None:
    """A role or purpose outside the enums is InvalidInput naming the allowed values."""
    with pytest.raises(InvalidInput, match=message) as info:
        resolve(given, tmp_path, role=Role.AGENT)
    assert "agent, clinician" in str(info.value) or "treatment, emergency" in str(info.value)


def test_identity_file_is_private_and_checked(tmp_path: Path) -> None:
    """write_identity writes mode 0600 JSON naming the actor and role; a malformed file is refused."""
    path = write_identity(tmp_path, Principal("alice", Role.ADMIN))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert (doc["actor"], doc["role"]) == ("alice", "admin")
    assert read_identity(tmp_path) == "alice"
    for bad in (
        "not json",
        '{"actor": "a b", "role": "admin"}',
        '{"actor": "alice"}',
        '{"actor": "x", "role": "boss"}',
    ):
        path.write_text(bad, encoding="utf-8")
        with pytest.raises(InvalidInput, match=IDENTITY_FILE):
            read_identity(tmp_path)
    path.unlink()
    assert read_identity(tmp_path) is None


# through the command line ---------------------------------------------------------------------


def test_init_records_the_admin_in_a_private_identity_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init without flags acts as the OS user with role admin and writes identity.json (0600)
    naming them; the consent policy it grants is audited under that id."""
    monkeypatch.setenv("LOGNAME", "os-user")
    rc, out, err = run(capsys, "init", tmp_path / "s")
    assert rc == 0, err
    assert "admin os-user" in out
    path = tmp_path / "s" / IDENTITY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text(encoding="utf-8"))["actor"] == "os-user"
    grants = {(e.actor, e.role) for e in audit_trail(tmp_path / "s") if e.action == "consent_grant"}
    assert grants == {("os-user", "admin")}


def test_init_with_another_role_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """init by a non-admin (flag or environment) exits 1 and leaves nothing behind."""
    rc, _, err = run(capsys, "init", tmp_path / "s", "--actor", "bot", "--role", "agent")
    assert rc == 1 and "may not init" in one_line_error(err)
    assert not (tmp_path / "s").exists()


def test_commands_without_any_identity_fail_naming_the_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """On a store without identity file (made by the Python API), a command with no principal
    flags or variables exits 1 naming --actor and --role; with them it runs."""
    MsmMem.init(tmp_path / "s", ADMIN_P).close()
    rc, out, err = run(capsys, "consent", "list", tmp_path / "s")
    assert rc == 1 and out == ""
    assert "--actor ID --role ROLE" in one_line_error(err)
    assert run(capsys, "consent", "list", tmp_path / "s", *ADMIN)[0] == 0


def test_precedence_end_to_end(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit trail names whom each command acted as: the identity file, then the
    environment over it, a global flag over that, a command flag over everything."""
    store = tmp_path / "s"
    assert run(capsys, "init", store, "--actor", "alice")[0] == 0
    assert run(capsys, "consent", "list", store)[0] == 0  # alice, default role admin
    monkeypatch.setenv("MSM_MEM_ACTOR", "eve")
    monkeypatch.setenv("MSM_MEM_ROLE", "auditor")
    assert run(capsys, "consent", "list", store)[0] == 0
    assert run(capsys, "--actor", "gus", "consent", "list", store)[0] == 0
    assert run(capsys, "--actor", "gus", "consent", "list", store, "--actor", "olga", "--role", "admin")[0] == 0
    lists = [(e.actor, e.role, e.purpose) for e in audit_trail(store) if e.action == "consent_list"]
    assert lists == [
        ("alice", "admin", "operations"),
        ("eve", "auditor", "audit"),
        ("gus", "auditor", "audit"),
        ("olga", "admin", "operations"),
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--actor", "bob", "--role", "nurse"], "unknown role 'nurse': use one of agent, clinician"),
        (["--actor", "bob", "--role", "admin", "--purpose", "fun"], "unknown purpose 'fun': use one of treatment"),
        (["--actor", "bob smith", "--role", "admin"], "principal id 'bob smith'"),
        (["--actor", "bob"], "needs a role too"),
    ],
)
def test_bad_principal_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], message: str
) -> None:
    """Unknown roles or purposes, malformed ids and a role-less actor exit 1 with one error line."""
    MsmMem.init(tmp_path / "s", ADMIN_P).close()
    rc, _, err = run(capsys, "consent", "list", tmp_path / "s", *flags)
    assert rc == 1 and message in one_line_error(err)


def test_bad_role_in_the_environment_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MSM_MEM_ROLE outside the enum gives the same clear error."""
    assert run(capsys, "init", tmp_path / "s", *ADMIN)[0] == 0
    monkeypatch.setenv("MSM_MEM_ROLE", "superuser")
    rc, _, err = run(capsys, "audit", "verify", tmp_path / "s")
    assert rc == 1 and "unknown role 'superuser'" in one_line_error(err)
