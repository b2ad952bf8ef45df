"""Handoff files (spec section 17): ``pack --handoff`` writes the identity of the restore point it
packs, so that the next machine checks against exactly what the last one ran; the file is read
back as the gate's expectations, strictly (a member twice, a FIFO, a nesting bomb: one line)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from .._posix import NotRegularFile, read_regular
from ..errors import ConfigError, NotFound, UsageError
from ..format import Manifest, Trainer
from ..storage import resolve
from ._config import check_json_data
from .gate import Expectations

__all__ = [
    "HANDOFF_FORMAT",
    "expectations_from_dict",
    "handoff_document",
    "load_expectations",
    "write_handoff",
]

HANDOFF_FORMAT = "restorepoint-handoff/1"
_IDENTITY = re.compile(r"[0-9a-f]{64}")


def handoff_document(manifest: Manifest, url: str) -> dict[str, Any]:
    """The handoff for a restore point: its identity part, as the next machine will expect it."""
    return {
        "cache_keys": dict(manifest.cache_keys),
        "cache_root": manifest.cache_root,
        "config": dict(manifest.config) if manifest.config is not None else None,
        "config_identity": manifest.config_identity,
        "handoff": HANDOFF_FORMAT,
        "id": manifest.id,
        "operational_keys": list(manifest.operational_keys),
        "position": manifest.position.to_dict(),
        "terms": dict(manifest.terms),
        "trainer": manifest.trainer.to_dict() if manifest.trainer is not None else None,
        "url": url,
    }


def write_handoff(path: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    """Write a handoff file atomically (temp file, fsync, rename)."""
    location = resolve(os.fspath(path))
    data = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"
    with location.publish() as publisher:
        publisher.write(data)


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal names: a handoff file saying "trainer" twice
    # would be read as whichever came last, where the head refuses the same ambiguity.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(f"the member {key!a} appears twice")
        out[key] = value
    return out


def _read_text(path: str) -> str:
    """A local file's text, refused unless it is a regular file (a FIFO would be waited on
    for a writer, forever, by a plain open)."""
    try:
        return read_regular(path).decode("utf-8")
    except NotRegularFile:
        raise ConfigError("not a regular file", url=path) from None


def load_expectations(path: str | os.PathLike[str]) -> Expectations:
    """Expectations from a handoff file (JSON). Every identity field it holds is expected."""
    p = os.fspath(path)
    try:
        raw = json.loads(_read_text(p), object_pairs_hook=_no_duplicates)
    except FileNotFoundError:
        raise NotFound("handoff file not found", url=str(path)) from None
    except _Duplicate as exc:
        raise ConfigError(f"not a handoff file: {exc}", url=str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"not a readable handoff file ({exc})", url=str(path)) from None
    except RecursionError:
        # A nesting bomb in a hand-edited file: one line, not an internal error.
        raise ConfigError("handoff file nested too deeply", url=str(path)) from None
    if not isinstance(raw, dict) or raw.get("handoff") != HANDOFF_FORMAT:
        raise ConfigError(f'not a handoff file (no "handoff": "{HANDOFF_FORMAT}")', url=str(path))
    try:
        return expectations_from_dict(raw)
    except UsageError as exc:
        raise ConfigError(exc.message, url=str(path)) from None


def expectations_from_dict(raw: Mapping[str, Any]) -> Expectations:  # noqa: PLR0912 - one branch per expectation field of the handoff document
    values: dict[str, Any] = {}
    if "trainer" in raw:
        t = raw["trainer"]
        if t is None:
            values["trainer"] = None
        elif (
            isinstance(t, dict)
            and isinstance(t.get("name"), str)
            and isinstance(t.get("version"), str)
        ):
            values["trainer"] = Trainer(t["name"], t["version"])
        else:
            raise UsageError("trainer must be null or {name, version}")
    for name in ("terms", "cache_keys"):
        if name in raw:
            m = raw[name]
            if not isinstance(m, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in m.items()
            ):
                raise UsageError(f"{name} must map names to strings")
            values[name] = dict(m)
    if "cache_root" in raw:
        if raw["cache_root"] is not None and not isinstance(raw["cache_root"], str):
            raise UsageError("cache_root must be a string or null")
        values["cache_root"] = raw["cache_root"]
    if raw.get("config") is not None:
        if not isinstance(raw["config"], dict):
            raise UsageError("config must be a mapping")
        values["config"] = check_json_data(raw["config"])
    elif raw.get("config_identity") is not None:
        identity = raw["config_identity"]
        if not isinstance(identity, str) or not _IDENTITY.fullmatch(identity):
            raise UsageError("config_identity must be 64 lowercase hex digits or null")
        values["config_identity"] = identity
    elif "config" in raw or "config_identity" in raw:
        # An explicit null config: expect a restore point that records none.
        values["config_identity"] = None
    return Expectations(**values)
