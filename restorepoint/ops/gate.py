"""The import gate: may this restore point be resumed here? (spec section "The import gate")

The gate compares what the importer expects (trainer, version terms, cache root, cache keys,
config identity) with the head of the restore point, which it reads from a bounded prefix of
the object: on S3 or GCS a refusal costs at most 1 MiB of reading, whatever the payload's size.
Every difference is reported, not just the first: a refusal says what to fix.

Expectations come from the command line, or from a **handoff** file (``ops.handoff``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .._text import plural
from ..errors import IncompatibleRestorePoint, at_url
from ..format import (
    CanonicalizationError,
    Manifest,
    Trainer,
    canonical_dumps,
    config_identity,
    diff_configs,
)
from ..storage import Location, resolve
from ._open import NO_TRUST, Trust, open_head

__all__ = [
    "CLI_HINTS",
    "FIELDS",
    "UNSET",
    "WORLD_FIELD",
    "CheckResult",
    "Expectations",
    "Mismatch",
    "Unset",
    "carries",
    "check",
    "compared_identity",
    "decide",
    "mismatches",
    "recorded_world",
    "refuse",
    "views_of",
    "world_mismatch",
]


class Unset(enum.Enum):
    """An expectation that is not given: not known here (distinct from an expected ``None``)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Final = Unset.UNSET

#: The gate's fields in the order mismatches are reported. ``config`` stands for the config and
#: its identity: one of them known is the field known.
FIELDS = ("trainer", "terms", "cache_root", "cache_keys", "config")

#: Compared when a view knows it, and never "unknown here": an import that names no world
#: resumes nothing rank by rank (it takes every part), so no world size is needed (spec 25.4).
WORLD_FIELD = "world_size"

#: What to give so that a field is known here (the CLI's words; the runtime passes its own).
CLI_HINTS: Mapping[str, str] = {
    "trainer": "give --trainer, --expect or an adapter",
    "terms": "give --term, --expect or an adapter",
    "cache_root": "give --cache-root, --expect, RESTOREPOINT_CACHE_ROOT or an adapter",
    "cache_keys": "give --key, --data, --expect or an adapter",
    "config": "give --config or --expect",
}


@dataclass(frozen=True)
class Expectations:
    """What the importer expects: one view of what this machine is (the local view an adapter
    detects, a handoff file, the command line). A field left UNSET is not known by this view;
    ``None`` for ``trainer`` or ``cache_root`` expects the restore point to record none.
    ``terms`` and ``cache_keys`` are compared as whole mappings: a name on one side only is a
    mismatch. ``sources`` names where each known field's value came from ("detected: torch",
    "--term", "handoff file"), for the refusal's lines and ``restorepoint local-view``."""

    trainer: Trainer | Unset | None = UNSET
    terms: Mapping[str, str] | Unset = UNSET
    cache_keys: Mapping[str, str] | Unset = UNSET
    cache_root: str | Unset | None = UNSET
    #: compared by identity, computed with the restore point's own operational keys
    config: Mapping[str, Any] | Unset = UNSET
    #: used only when no config is given
    config_identity: str | Unset | None = UNSET
    #: the number of ranks this machine's job resumes on (spec 25.4)
    world_size: int | Unset = UNSET
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def empty(self) -> bool:
        return not any(self.knows(name) for name in (*FIELDS, WORLD_FIELD))

    def knows(self, name: str) -> bool:
        """Whether this view has a value for the gate field ``name`` (one of FIELDS, or
        ``world_size``)."""
        if name == "config":
            return self.config is not UNSET or self.config_identity is not UNSET
        return getattr(self, name) is not UNSET

    def source(self, name: str) -> str | None:
        """Where the value of ``name`` came from; for one name of terms or cache keys
        (``terms.cuda``), where that name's value came from, if another source set it."""
        found = self.sources.get(name)
        if found is None and "." in name:
            found = self.sources.get(name.split(".", 1)[0])
        return found

    def from_source(self, source: str) -> Expectations:
        """These expectations with ``source`` named for every known field that names none."""
        sources = {n: source for n in (*FIELDS, WORLD_FIELD) if self.knows(n)}
        return replace(self, sources={**sources, **self.sources})

    def merged(self, overrides: Expectations) -> Expectations:
        """These expectations with ``overrides`` on top: a whole field replaces, except terms
        and cache keys, which are merged name by name (and their sources joined)."""
        out = self
        sources = dict(self.sources)
        for name in (*FIELDS, "config_identity", WORLD_FIELD):
            new = getattr(overrides, name)
            if new is UNSET:
                continue
            old = getattr(out, name)
            key = "config" if name == "config_identity" else name
            if name in ("terms", "cache_keys") and isinstance(old, Mapping):
                # Name by name: each overridden name keeps where its own value came from.
                given = overrides.sources.get(key)
                for entry in new:
                    if given is not None:
                        sources[f"{key}.{entry}"] = given
                    else:
                        sources.pop(f"{key}.{entry}", None)
                new = {**old, **new}
                if key not in sources and given is not None:
                    sources[key] = given
            elif key in overrides.sources:
                sources[key] = overrides.sources[key]
            else:
                sources.pop(key, None)
            if name == "config":
                out = replace(out, config_identity=UNSET)
            elif name == "config_identity" and overrides.config is UNSET:
                # Otherwise the base's config would win over the identity asked for on top.
                out = replace(out, config=UNSET)
            out = replace(out, **{name: new})
        return replace(out, sources=sources)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in (*FIELDS, "config_identity", WORLD_FIELD):
            value = getattr(self, name)
            if value is UNSET:
                continue
            out[name] = value.to_dict() if isinstance(value, Trainer) else value
        return out


@dataclass(frozen=True)
class Mismatch:
    """One expectation the restore point does not meet. ``field`` is a dotted name
    (``trainer``, ``terms.cuda``, ``cache_keys.dataset``, ``cache_root``, ``config.lr``,
    ``config_identity``); an absent side is reported as absent, not as null. ``unknown``: the
    restore point records the field and no view knows it here (the strict rule of spec
    section 16); ``hint`` then says what to give. ``source``: where the value here came from."""

    field: str
    expected: Any
    found: Any
    expected_present: bool = True
    found_present: bool = True
    source: str | None = None
    unknown: bool = False
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field}
        if self.expected_present:
            out["expected"] = self.expected
        if self.found_present:
            out["found"] = self.found
        if self.unknown:
            out["unknown"] = True
        if self.source is not None:
            out["source"] = self.source
        return out

    def describe(self) -> str:
        found = _show(self.found, self.found_present)
        if self.unknown:
            hint = f" ({self.hint})" if self.hint else ""
            return f"{self.field}: unknown here{hint}; in the restore point {found}"
        here = _show(self.expected, self.expected_present)
        source = f" ({self.source})" if self.source else ""
        line = f"{self.field}: here {here}{source}, in the restore point {found}"
        if self.field == WORLD_FIELD:
            line += " (its state is not declared reshardable)"
        return line


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
    name: str, expected: Mapping[str, str], found: Mapping[str, str], view: Expectations
) -> list[Mismatch]:
    out = []
    for key in sorted(set(expected) | set(found)):
        field_name = f"{name}.{key}"
        source = view.source(field_name)
        if key not in found:
            out.append(Mismatch(field_name, expected[key], None, True, False, source))
        elif key not in expected:
            out.append(Mismatch(field_name, None, found[key], False, True, source))
        elif expected[key] != found[key]:
            out.append(Mismatch(field_name, expected[key], found[key], source=source))
    return out


def carries(manifest: Manifest, name: str) -> bool:
    """Whether the restore point records something for the gate field ``name``: a trainer, a
    cache root or a config that is not null, terms or cache keys that are not empty."""
    if name == "trainer":
        return manifest.trainer is not None
    if name == "terms":
        return bool(manifest.terms)
    if name == "cache_root":
        return manifest.cache_root is not None
    if name == "cache_keys":
        return bool(manifest.cache_keys)
    return manifest.config_identity is not None


def _recorded(manifest: Manifest, name: str) -> Any:
    if name == "trainer":
        return _trainer(manifest.trainer)
    if name == "config":
        return manifest.config_identity
    value = getattr(manifest, name)
    return dict(value) if isinstance(value, Mapping) else value


def _field_mismatches(manifest: Manifest, name: str, expect: Expectations) -> list[Mismatch]:  # noqa: PLR0911 - one return per gate field kind
    source = expect.source(name)
    if name == "trainer":
        if expect.trainer is not UNSET and expect.trainer != manifest.trainer:
            return [
                Mismatch(
                    "trainer",
                    _trainer(expect.trainer),
                    _trainer(manifest.trainer),
                    source=source,
                )
            ]
    elif name == "terms":
        if expect.terms is not UNSET:
            return _compare_maps("terms", expect.terms, manifest.terms, expect)
    elif name == "cache_root":
        if expect.cache_root is not UNSET and expect.cache_root != manifest.cache_root:
            return [Mismatch("cache_root", expect.cache_root, manifest.cache_root, source=source)]
    elif name == "cache_keys":
        if expect.cache_keys is not UNSET:
            return _compare_maps("cache_keys", expect.cache_keys, manifest.cache_keys, expect)
    elif expect.config is not UNSET:
        return _config_mismatches(manifest, expect.config, source)
    elif expect.config_identity is not UNSET and expect.config_identity != manifest.config_identity:
        return [
            Mismatch(
                "config_identity",
                expect.config_identity,
                manifest.config_identity,
                source=source,
            )
        ]
    return []


def mismatches(
    manifest: Manifest,
    *views: Expectations,
    strict: bool = False,
    defer: Iterable[str] = (),
    hints: Mapping[str, str] = CLI_HINTS,
) -> list[Mismatch]:
    """Every expectation that ``manifest`` (a head is enough) does not meet, in a fixed order:
    trainer, terms, cache root, cache keys, config. The restore point must meet every view
    (a handoff file and this machine's local view, say): a field two views know is compared
    with each. ``strict`` is the rule of every resume (spec section 16): a field the restore
    point records that no view knows is a refusal ("unknown here"), never a pass; ``defer``
    names fields that a later gate will compare (a trainer that gates itself) instead."""
    deferred = set(defer)
    out: list[Mismatch] = []
    for name in FIELDS:
        knowing = [view for view in views if view.knows(name)]
        if not knowing:
            if strict and name not in deferred and carries(manifest, name):
                out.append(
                    Mismatch(
                        name, None, _recorded(manifest, name), False, True,
                        unknown=True, hint=hints.get(name),
                    )
                )  # fmt: skip
            continue
        seen: set[tuple[str, str, str]] = set()
        for view in knowing:
            for m in _field_mismatches(manifest, name, view):
                key = (m.field, _show(m.expected, m.expected_present), m.source or "")
                if key not in seen:
                    seen.add(key)
                    out.append(m)
    worlds = {v.world_size: v.source(WORLD_FIELD) for v in views if isinstance(v.world_size, int)}
    for world_size, source in sorted(worlds.items()):
        found = world_mismatch(manifest, world_size, source)
        if found is not None:
            out.append(found)
    return out


def recorded_world(manifest: Manifest) -> int:
    """The world size a restore point was made by: its commit's, else 1 (spec 25.4)."""
    return manifest.parts.world_size if manifest.parts is not None else 1


def world_mismatch(manifest: Manifest, world_size: int, source: str | None) -> Mismatch | None:
    """A resume on ``world_size`` ranks of a restore point made by another number, unless
    its state is declared reshardable (spec 25.4); None when it may go on."""
    found = recorded_world(manifest)
    if found == world_size or (manifest.parts is not None and manifest.parts.reshardable):
        return None
    return Mismatch(WORLD_FIELD, world_size, found, source=source)


def compared_identity(config: Mapping[str, Any], operational: Sequence[str]) -> str:
    """The identity of this machine's config that the gate compares: computed with the
    operational keys the restore point declares (``local-view --against`` shows this one)."""
    return config_identity(config, operational)


def _config_mismatches(
    manifest: Manifest, config: Mapping[str, Any], source: str | None
) -> list[Mismatch]:
    """The config is compared by its ``compared_identity``; when the identities differ, every
    differing key is named."""
    operational = manifest.operational_keys
    expected_identity = compared_identity(config, operational)
    if expected_identity == manifest.config_identity:
        return []
    if manifest.config is None:
        return [Mismatch("config_identity", expected_identity, None, source=source)]
    diffs = diff_configs(config, manifest.config, operational)
    if not diffs:  # pragma: no cover - equal views have equal identities
        return [
            Mismatch("config_identity", expected_identity, manifest.config_identity, source=source)
        ]
    return [
        Mismatch(
            f"config.{d.path}", d.expected, d.found, d.expected_present, d.found_present, source
        )
        for d in diffs
    ]


@dataclass(frozen=True)
class CheckResult:
    """The gate's decision: the restore point's head and what did not match (empty: pass).
    ``gated``: whether anything was compared at all (a plain import with no expectation is
    not gated)."""

    url: str
    manifest: Manifest
    mismatches: list[Mismatch] = field(default_factory=list)
    gated: bool = True

    @property
    def compatible(self) -> bool:
        return not self.mismatches

    def to_dict(self) -> dict[str, Any]:
        return {
            "compatible": self.compatible,
            "gated": self.gated,
            "id": self.manifest.id,
            "mismatches": [m.to_dict() for m in self.mismatches],
            "ok": self.compatible,
            "position": self.manifest.position.to_dict(),
            "url": self.url,
        }


def refuse(result: CheckResult) -> IncompatibleRestorePoint:
    fields = ", ".join(m.field for m in result.mismatches)
    return IncompatibleRestorePoint(
        f"refused: {plural(len(result.mismatches), 'expectation')} not met ({fields})",
        url=result.url,
        mismatches=[m.to_dict() for m in result.mismatches],
        details=[m.describe() for m in result.mismatches],
    )


def views_of(expect: Expectations | Sequence[Expectations] | None) -> tuple[Expectations, ...]:
    """The views a gate compares with: one Expectations, several, or none."""
    if expect is None:
        return ()
    if isinstance(expect, Expectations):
        return (expect,)
    return tuple(expect)


def decide(  # noqa: PLR0913 - public API: the gate's keyword options
    url: str,
    manifest: Manifest,
    expect: Expectations | Sequence[Expectations] | None,
    *,
    strict: bool = False,
    defer: Iterable[str] = (),
    hints: Mapping[str, str] = CLI_HINTS,
) -> CheckResult:
    """The gate's decision on a head: what ``check`` and every import use."""
    views = views_of(expect)
    gated = strict or any(not v.empty for v in views)
    found = mismatches(manifest, *views, strict=strict, defer=defer, hints=hints)
    return CheckResult(url, manifest, found, gated)


def check(  # noqa: PLR0913 - public API: the gate's keyword options
    url: str | Location,
    expect: Expectations | Sequence[Expectations],
    *,
    storage_options: dict[str, Any] | None = None,
    raise_on_mismatch: bool = True,
    trust: Trust = NO_TRUST,
    strict: bool = False,
    hints: Mapping[str, str] = CLI_HINTS,
) -> CheckResult:
    """The gate alone: read the head from a bounded prefix and compare. Raises
    IncompatibleRestorePoint (exit 3) listing every mismatch, unless ``raise_on_mismatch`` is
    False; integrity and storage errors as usual. Nothing is written anywhere. ``strict``: a
    field the restore point records that no expectation knows is refused (spec section 16),
    as every resume does."""
    location = resolve(url, storage_options)
    with at_url(location.url):
        reader = location.reader()
        try:
            head = open_head(reader, trust).head.manifest
        finally:
            reader.close()
        result = decide(location.url, head, expect, strict=strict, hints=hints)
        if raise_on_mismatch and not result.compatible:
            raise refuse(result)
        return result
