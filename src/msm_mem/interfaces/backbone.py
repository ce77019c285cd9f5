"""The backbone of a deployment: which model answers ``ask`` in ``serve``, ``mcp`` and ``ask``.

It is configuration, from three places (a later one wins, option by option):

1. a TOML file named by ``--backbone-config FILE`` or ``MSM_MEM_BACKBONE_CONFIG``::

       name = "openai"
       [options]
       base_url = "http://gpu-host:8000/v1"
       model = "llava-hf/llava-1.5-7b-hf"
       timeout_s = 60

2. the environment: ``MSM_MEM_BACKBONE`` (the name) and ``MSM_MEM_BACKBONE_OPTIONS`` (a JSON
   object of options);
3. the command line: ``--backbone NAME`` and repeated ``--backbone-option KEY=VALUE`` (a JSON
   value, else text: ``timeout_s=30`` is a number, ``model=llava`` text).

Options from another backbone than the one chosen are dropped with the name they came with (a
file for ``openai`` does not configure ``--backbone nonparametric``). The model server's API key
comes from ``MSM_MEM_BACKBONE_API_KEY`` only: an ``api_key`` option anywhere else is refused, so
a key never sits in a shell history, a process list, a file of settings or a log.

An unknown option names those the backbone takes; :meth:`BackboneConfig.build` checks their
values (types, the URL scheme and the timeout bounds are the backbone's own checks) and
:func:`probe` asks a backbone that can be asked (``openai``: ``GET {base_url}/models``) whether
its server answers, so a deployment with an unreachable model server fails at start.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .. import Backbone, InvalidInput, get_backbone
from .._files import read_regular
from ..plugins.backbones import known_backbones, option_names

__all__ = [
    "API_KEY_ENV",
    "CONFIG_ENV",
    "NAME_ENV",
    "OPTIONS_ENV",
    "BackboneConfig",
    "parse_options",
    "probe",
]

#: the model server's API key (the only place it is read from)
API_KEY_ENV = "MSM_MEM_BACKBONE_API_KEY"
#: the backbone's name
NAME_ENV = "MSM_MEM_BACKBONE"
#: the backbone's options, a JSON object
OPTIONS_ENV = "MSM_MEM_BACKBONE_OPTIONS"
#: a TOML file with ``name`` and ``[options]``
CONFIG_ENV = "MSM_MEM_BACKBONE_CONFIG"

_SECRETS = frozenset({"api_key"})
# objects a library caller may pass, never configuration: the openai backbone's test hook and the
# fitted backbone's encoder (its file names the encoder)
_NOT_SETTINGS = frozenset({"sleep", "encoder"})
_MAX_FILE_BYTES = 64 * 1024
_DEFAULT = "nonparametric"


def parse_options(pairs: Sequence[str], *, flag: str = "--backbone-option") -> dict[str, Any]:
    """``KEY=VALUE`` pairs as options: each value read as JSON, else kept as text."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"{flag} wants KEY=VALUE, got {pair.partition('=')[0]!r} without '='")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        options[key.strip()] = value
    return options


def _no_secrets(options: Mapping[str, Any], where: str) -> None:
    if found := sorted(_SECRETS & set(options)):
        raise InvalidInput(f"{found[0]} may not come from {where}: set {API_KEY_ENV} in the environment instead")


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidInput(f"{where} must be an object of options, got {type(value).__name__}")
    return dict(value)


def _from_file(path: Path) -> tuple[str | None, dict[str, Any]]:
    data = read_regular(path, max_bytes=_MAX_FILE_BYTES)
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"backbone configuration {path} is not TOML: {exc}") from None
    if unknown := sorted(set(doc) - {"name", "options"}):
        raise InvalidInput(f"backbone configuration {path}: unknown key(s) {unknown}; use name and [options]")
    name = doc.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidInput(f"backbone configuration {path}: name must be text")
    options = _object(doc.get("options", {}), f"backbone configuration {path}: [options]")
    _no_secrets(options, f"the backbone configuration {path}")
    return name, options


@dataclass(frozen=True, slots=True)
class BackboneConfig:
    """A backbone by ``name`` with its ``options`` (JSON values; never the API key)."""

    name: str = _DEFAULT
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in known_backbones():
            raise InvalidInput(f"unknown backbone {self.name!r}; known: {', '.join(known_backbones())}")
        options = _object(dict(self.options), "backbone options")
        _no_secrets(options, "the command line or a file of settings")
        params = option_names(self.name)
        takes = [n for n in params if n not in _SECRETS | _NOT_SETTINGS]
        if unknown := sorted(set(options) - set(takes)):
            key = f", and its API key from {API_KEY_ENV}" if _SECRETS & set(params) else ""
            raise InvalidInput(
                f"backbone {self.name!r} has no option {unknown[0]!r}; it takes {', '.join(takes) or 'none'}{key}"
            )
        object.__setattr__(self, "options", MappingProxyType(options))

    @classmethod
    def resolve(
        cls,
        name: str | None = None,
        pairs: Sequence[str] = (),
        *,
        file: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> BackboneConfig:
        """The backbone named by the flags (``name``, ``pairs``), the environment and the file
        (``file``, else ``MSM_MEM_BACKBONE_CONFIG``), in that order of precedence (see the
        module docstring); the default is ``nonparametric`` with no options."""
        env = os.environ if environ is None else environ
        layers: list[tuple[str | None, dict[str, Any]]] = []
        path = file if file is not None else (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
        if path is not None:
            layers.append(_from_file(path))
        env_options: dict[str, Any] = {}
        if env.get(OPTIONS_ENV):
            try:
                env_options = _object(json.loads(env[OPTIONS_ENV]), OPTIONS_ENV)
            except ValueError:
                raise InvalidInput(f"{OPTIONS_ENV} is not a JSON object") from None
            _no_secrets(env_options, OPTIONS_ENV)
        layers.append((env.get(NAME_ENV) or None, env_options))
        flag_options = parse_options(pairs)
        _no_secrets(flag_options, "the command line")
        layers.append((name, flag_options))
        chosen = next((n for n, _ in reversed(layers) if n), _DEFAULT)
        options: dict[str, Any] = {}
        for layer_name, layer_options in layers:
            if layer_name in (None, chosen):  # options given without a name go with the chosen one
                options.update(layer_options)
        return cls(chosen, options)

    def build(self, environ: Mapping[str, str] | None = None) -> Backbone:
        """The backbone, its options checked by the backbone itself (InvalidInput naming the
        options it takes); the API key from ``MSM_MEM_BACKBONE_API_KEY`` when it takes one."""
        return get_backbone(self.name, **self.runtime_options(environ))

    def runtime_options(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The options the backbone is built with: these, and the API key from
        ``MSM_MEM_BACKBONE_API_KEY`` for a backbone that takes one (``openai``)."""
        env = os.environ if environ is None else environ
        options = dict(self.options)
        if env.get(API_KEY_ENV) and self.name == "openai":
            options["api_key"] = env[API_KEY_ENV]
        return options

    def to_json(self) -> dict[str, Any]:
        """``{"name", "options"}``: what a worker process is given (never the key)."""
        return {"name": self.name, "options": dict(self.options)}

    @classmethod
    def from_json(cls, doc: object) -> BackboneConfig:
        d = _object(doc, "backbone")
        return cls(str(d.get("name", _DEFAULT)), _object(d.get("options", {}), "backbone options"))


def probe(backbone: Backbone) -> str:
    """What the backbone's server says when asked whether it answers (``""`` for a backbone
    with nothing to ask); :class:`~msm_mem.BackendUnavailable` when it cannot be reached."""
    check = getattr(backbone, "probe", None)
    if not callable(check):
        return ""
    return str(check())
