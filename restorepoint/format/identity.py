"""Config identity: what was trained, as one hash (spec section "Config identity").

The identity is the sha256 of the RFC 8785 canonical JSON of the training config with the
operational keys removed. Operational keys (dotted paths such as ``train.checkpoint_every``)
name settings that do not change what is trained: how often to checkpoint, auto-resume
switches, resubmit limits, logging. A mapping that the removal leaves empty is removed too, so
that adding a section of operational settings to a config never moves its identity."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._json import CanonicalizationError, canonical_dumps

__all__ = [
    "ConfigDifference",
    "check_operational_key",
    "config_identity",
    "diff_configs",
    "identity_view",
]

_MISSING: Any = object()


def check_operational_key(key: str) -> str:
    """Validate one dotted path; raise ValueError with the reason."""
    if not isinstance(key, str) or not key:
        raise ValueError("an operational key is a non-empty dotted path")
    if any(part == "" for part in key.split(".")):
        raise ValueError(f"operational key {key!r} has an empty path segment")
    return key


def identity_view(config: Mapping[str, Any], operational_keys: Iterable[str]) -> dict[str, Any]:
    """A deep copy of ``config`` without the operational keys (and mappings left empty)."""
    view: dict[str, Any] = copy.deepcopy(dict(config))
    for key in operational_keys:
        parts = check_operational_key(key).split(".")
        trail: list[tuple[dict[str, Any], str]] = []
        node: dict[str, Any] | None = view
        for part in parts[:-1]:
            assert node is not None
            child = node.get(part)
            if not isinstance(child, dict):
                node = None
                break
            trail.append((node, part))
            node = child
        if node is not None:
            node.pop(parts[-1], None)
        # Prune the mappings on the key's path that hold nothing else, whether the key was
        # there or not: {"log": {}} and {"log": {"every": 10}} are the same training.
        for parent, part in reversed(trail):
            if parent[part]:
                break
            del parent[part]
    return view


def config_identity(config: Mapping[str, Any], operational_keys: Iterable[str] = ()) -> str:
    """The config identity: lowercase hex sha256 of the canonical identity view.

    Raises ValueError (CanonicalizationError) when the config holds values JSON cannot
    represent exactly (NaN, infinities, integers beyond 2**53 - 1, non-string keys)."""
    data = canonical_dumps(identity_view(config, operational_keys))
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ConfigDifference:
    """One dotted path where two identity views differ; MISSING sides are ``None`` + flag."""

    path: str
    expected: Any
    found: Any
    expected_present: bool = True
    found_present: bool = True

    def describe(self) -> str:
        exp = canonical_dumps(self.expected).decode() if self.expected_present else "(absent)"
        got = canonical_dumps(self.found).decode() if self.found_present else "(absent)"
        return f"{self.path}: expected {exp}, found {got}"


def diff_configs(
    expected: Mapping[str, Any], found: Mapping[str, Any], operational_keys: Iterable[str] = ()
) -> list[ConfigDifference]:
    """Every leaf path whose value differs between two configs' identity views, sorted."""
    keys = list(operational_keys)
    out: list[ConfigDifference] = []
    _diff(identity_view(expected, keys), identity_view(found, keys), "", out)
    return sorted(out, key=lambda d: d.path)


def _same(a: Any, b: Any) -> bool:
    try:
        return canonical_dumps(a) == canonical_dumps(b)
    except CanonicalizationError:
        return False


def _diff(a: Any, b: Any, prefix: str, out: list[ConfigDifference]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in b:
                out.append(ConfigDifference(path, a[key], None, True, False))
            elif key not in a:
                out.append(ConfigDifference(path, None, b[key], False, True))
            else:
                _diff(a[key], b[key], path, out)
    elif not _same(a, b):
        out.append(ConfigDifference(prefix or "(root)", a, b))
