"""Every install hint of a MissingExtra names an extra that pyproject.toml defines."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "msm_mem"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _hinted_extras() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "MissingExtra" and len(node.args) == 2:
                extra = node.args[1]
                if isinstance(extra, ast.Constant) and isinstance(extra.value, str):
                    found[extra.value] = f"{path.relative_to(SRC)}:{node.lineno}"
    return found


def test_every_missing_extra_hint_names_a_defined_extra() -> None:
    """A MissingExtra("pkg", "extra") anywhere in the package points at a real extra."""
    extras = set(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"])
    hinted = _hinted_extras()
    assert hinted, "no MissingExtra hints found: the scan is broken"
    missing = {name: where for name, where in hinted.items() if name not in extras}
    assert not missing, f"install hints name extras that pyproject.toml lacks: {missing}"


def test_encoder_registry_extras_are_defined() -> None:
    """Each encoder plugin's extra (used in its MissingExtra hint) is defined."""
    from msm_mem.plugins.encoders import _REGISTRY

    extras = set(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"])
    assert {p.extra for p in _REGISTRY.values() if p.extra} <= extras
