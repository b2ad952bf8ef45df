"""The import gate: may this restore point be resumed here? (spec section "The import gate")

The gate compares what the importer expects (trainer, version terms, cache root, cache keys,
config identity) with the head of the restore point, which it reads from a bounded prefix of
the object: on S3 or GCS a refusal costs at most 1 MiB of reading, whatever the payload's size.
Every difference is reported, not just the first: a refusal says what to fix.

Expectations come from the command line, or from a **handoff** file that ``pack --handoff``
writes for the restore point it packs, so that the next machine checks against exactly what the
last one ran.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError, IncompatibleRestorePoint, NotFound, UsageError, at_url
from ..format import (
    CanonicalizationError,
    Manifest,
    Trainer,
    canonical_dumps,
    config_identity,
    diff_configs,
)
from ..storage import Location, resolve
from ._config import check_json_data
from ._open import NO_TRUST, Trust, open_head

__all__ = [
    "HANDOFF_FORMAT",
    "CheckResult",
    "Expectations",
    "Mismatch",
    "check",
    "handoff_document",
    "load_expectations",
    "mismatches",
    "write_handoff",
]

HANDOFF_FORMAT = "restorepoint-handoff/1"
_IDENTITY = re.compile(r"[0-9a-f]{64}")


class _Unset:
    """An expectation that was not given (distinct from an expected ``None``)."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Expectations:
    """What the importer expects. A field left UNSET is not checked; ``None`` for ``trainer``
    or ``cache_root`` expects the restore point to record none. ``terms`` and ``cache_keys``
    are compared as whole mappings: a name on one side only is a mismatch."""

    trainer: Any = UNSET  # Trainer | None
    terms: Any = UNSET  # Mapping[str, str]
    cache_keys: Any = UNSET  # Mapping[str, str]
    cache_root: Any = UNSET  # str | None
    config: Any = UNSET  # Mapping[str, Any] (its identity is computed with the RP's keys)
    config_identity: Any = UNSET  # str: only when no config is given

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is UNSET for name in self.__dataclass_fields__)

    def merged(self, overrides: Expectations) -> Expectations:
        """These expectations with ``overrides`` on top: a whole field replaces, except terms
        and cache keys, which are merged name by name."""
        out = self
        for name in self.__dataclass_fields__:
            new = getattr(overrides, name)
            if new is UNSET:
                continue
            old = getattr(out, name)
            if name in ("terms", "cache_keys") and isinstance(old, Mapping):
                new = {**old, **new}
            if name == "config":
                out = replace(out, config_identity=UNSET)
            elif name == "config_identity" and overrides.config is UNSET:
                # Otherwise the base's config would win over the identity asked for on top.
                out = replace(out, config=UNSET)
            out = replace(out, **{name: new})
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is UNSET:
                continue
            out[name] = value.to_dict() if isinstance(value, Trainer) else value
        return out


@dataclass(frozen=True)
class Mismatch:
    """One expectation the restore point does not meet. ``field`` is a dotted name
    (``trainer``, ``terms.cuda``, ``cache_keys.dataset``, ``cache_root``, ``config.lr``,
    ``config_identity``); an absent side is reported as absent, not as null."""

    field: str
    expected: Any
    found: Any
    expected_present: bool = True
    found_present: bool = True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field}
        if self.expected_present:
            out["expected"] = self.expected
        if self.found_present:
            out["found"] = self.found
        return out

    def describe(self) -> str:
        return (
            f"{self.field}: expected {_show(self.expected, self.expected_present)}, "
            f"found {_show(self.found, self.found_present)}"
        )


def _show(value: Any, present: bool) -> str:
    if not present:
        return "(absent)"
    if value is None:
        return "(none)"
    if isinstance(value, str):
        return value
    try:
        return canonical_dumps(value).decode()
    except CanonicalizationError:
        return repr(value)


def _trainer(value: Trainer | None) -> Any:
    return None if value is None else f"{value.name}={value.version}"


def _compare_maps(
    name: str, expected: Mapping[str, str], found: Mapping[str, str]
) -> list[Mismatch]:
    out = []
    for key in sorted(set(expected) | set(found)):
        if key not in found:
            out.append(Mismatch(f"{name}.{key}", expected[key], None, True, False))
        elif key not in expected:
            out.append(Mismatch(f"{name}.{key}", None, found[key], False, True))
        elif expected[key] != found[key]:
            out.append(Mismatch(f"{name}.{key}", expected[key], found[key]))
    return out


def mismatches(manifest: Manifest, expect: Expectations) -> list[Mismatch]:
    """Every expectation that ``manifest`` (a head is enough) does not meet, in a fixed order:
    trainer, terms, cache root, cache keys, config."""
    out: list[Mismatch] = []
    if expect.trainer is not UNSET and expect.trainer != manifest.trainer:
        out.append(Mismatch("trainer", _trainer(expect.trainer), _trainer(manifest.trainer)))
    if expect.terms is not UNSET:
        out += _compare_maps("terms", expect.terms, manifest.terms)
    if expect.cache_root is not UNSET and expect.cache_root != manifest.cache_root:
        out.append(Mismatch("cache_root", expect.cache_root, manifest.cache_root))
    if expect.cache_keys is not UNSET:
        out += _compare_maps("cache_keys", expect.cache_keys, manifest.cache_keys)
    if expect.config is not UNSET:
        out += _config_mismatches(manifest, expect.config)
    elif expect.config_identity is not UNSET and expect.config_identity != manifest.config_identity:
        out.append(Mismatch("config_identity", expect.config_identity, manifest.config_identity))
    return out


def _config_mismatches(manifest: Manifest, config: Mapping[str, Any]) -> list[Mismatch]:
    """The config is compared by identity, computed with the operational keys that the restore
    point declares; when the identities differ, every differing key is named."""
    operational = manifest.operational_keys
    expected_identity = config_identity(config, operational)
    if expected_identity == manifest.config_identity:
        return []
    if manifest.config is None:
        return [Mismatch("config_identity", expected_identity, None)]
    diffs = diff_configs(config, manifest.config, operational)
    if not diffs:  # pragma: no cover - equal views have equal identities
        return [Mismatch("config_identity", expected_identity, manifest.config_identity)]
    return [
        Mismatch(f"config.{d.path}", d.expected, d.found, d.expected_present, d.found_present)
        for d in diffs
    ]


@dataclass(frozen=True)
class CheckResult:
    """The gate's decision: the restore point's head and what did not match (empty: pass)."""

    url: str
    manifest: Manifest
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def compatible(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        return {
            "compatible": self.compatible,
            "id": self.manifest.id,
            "mismatches": [m.to_dict() for m in self.mismatches],
            "ok": self.compatible,
            "position": self.manifest.position.to_dict(),
            "url": self.url,
        }


def refuse(result: CheckResult) -> IncompatibleRestorePoint:
    fields = ", ".join(m.field for m in result.mismatches)
    return IncompatibleRestorePoint(
        f"refused: {len(result.mismatches)} expectation(s) not met ({fields})",
        url=result.url,
        mismatches=[m.to_dict() for m in result.mismatches],
        details=[m.describe() for m in result.mismatches],
    )


def check(
    url: str | Location,
    expect: Expectations,
    *,
    storage_options: dict[str, Any] | None = None,
    raise_on_mismatch: bool = True,
    trust: Trust = NO_TRUST,
) -> CheckResult:
    """The gate alone: read the head from a bounded prefix and compare. Raises
    IncompatibleRestorePoint (exit 3) listing every mismatch, unless ``raise_on_mismatch`` is
    False; integrity and storage errors as usual. Nothing is written anywhere."""
    location = resolve(url, storage_options)
    with at_url(location.url):
        reader = location.reader()
        try:
            head = open_head(reader, trust).head.manifest
        finally:
            reader.close()
        result = CheckResult(location.url, head, mismatches(head, expect))
        if raise_on_mismatch and not result.compatible:
            raise refuse(result)
        return result


# -- handoff files -------------------------------------------------------------------------


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
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError("not a regular file", url=path)
        os.set_blocking(fd, True)
        return f.read().decode("utf-8")


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


def expectations_from_dict(raw: Mapping[str, Any]) -> Expectations:
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
