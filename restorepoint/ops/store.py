"""Stores: a URL prefix that holds the restore points of one or more runs (spec section
"Stores").

Layout: ``STORE/RUN/STEP-CREATED-ID.rp``, where STEP is the step in 16 digits, CREATED the
creation time (``YYYYMMDDTHHMMSSmmmZ``) and ID the first 12 hex digits of the restore-point id,
so that names sort by run, then step, then time. Anything else under the prefix (partial names,
other files) is not a restore point and is never listed as one.

Publishing into a store is a create-only publish under a fresh name, so two publishers never
collide. Pruning deletes the oldest first and never the run's newest restore point, the newest
one that verifies, or anything newer than that: a prune killed at any moment leaves every
restore point it meant to keep, and the next prune finishes the job.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import IntegrityError, NotFound, UsageError, at_url
from ..format import Manifest
from ..format.metrics import METRIC_NAME
from ..storage import Location, ObjectInfo, is_partial_name, parse_partial, resolve
from ._delta import keep_bases
from ._multipart import PARTS_SUFFIX, parts_prefix
from ._naming import NAME_PATTERN as _NAME
from ._naming import RUN_PATTERN as _RUN
from ._naming import entry_name, is_store_url
from ._open import NO_TRUST, Trust, open_head
from .resumed import live_markers
from .verify import verify

__all__ = [
    "DEFAULT_GRACE_S",
    "KeepBest",
    "PruneReport",
    "StoreEntry",
    "entry_head",
    "entry_name",
    "is_store_url",
    "latest",
    "list_store",
    "parse_duration",
    "prune",
]

#: Leftovers of interrupted uploads younger than this are left alone: they may be live.
DEFAULT_GRACE_S = 24 * 3600


@dataclass(frozen=True)
class StoreEntry:
    """A restore point in a store, as its name describes it."""

    run: str
    step: int
    created: str  # the name's stamp: YYYYMMDDTHHMMSSmmmZ
    id_prefix: str
    name: str
    url: str
    size: int

    @property
    def created_at(self) -> float:
        return (
            datetime.strptime(self.created, "%Y%m%dT%H%M%S%fZ")
            .replace(tzinfo=timezone.utc)
            .timestamp()
        )

    @property
    def sort_key(self) -> tuple[int, str, str]:
        return (self.step, self.created, self.id_prefix)

    def to_dict(self) -> dict[str, Any]:
        created = datetime.strptime(self.created, "%Y%m%dT%H%M%S%fZ")
        return {
            "created": created.strftime("%Y-%m-%dT%H:%M:%S.") + self.created[-4:-1] + "Z",
            "name": self.name,
            "run": self.run,
            "size": self.size,
            "step": self.step,
            "url": self.url,
        }


def _parse(info: ObjectInfo) -> StoreEntry | None:
    parts = info.name.split("/")
    # fullmatch: RUN_PATTERN ends in "$", which also matches before a trailing newline.
    if len(parts) != 2 or not _RUN.fullmatch(parts[0]) or is_partial_name(parts[1]):
        return None
    match = _NAME.match(parts[1])
    if match is None:
        return None
    try:
        # The pattern admits month 13 or hour 99: such a name is garbage, not a restore point
        # whose time nothing can compute (keep-within, list --json).
        datetime.strptime(match.group(2), "%Y%m%dT%H%M%S%fZ")
    except ValueError:
        return None
    return StoreEntry(
        run=parts[0],
        step=int(match.group(1)),
        created=match.group(2),
        id_prefix=match.group(3),
        name=info.name,
        url=info.url,
        size=info.size,
    )


def _store(url: str | Location, storage_options: dict[str, Any] | None) -> Location:
    location = resolve(url, storage_options)
    if isinstance(url, str) and not url.endswith("/"):
        location = resolve(url + "/", storage_options)
    return location


def list_store(
    store: str | Location, *, run: str | None = None, storage_options: dict[str, Any] | None = None
) -> list[StoreEntry]:
    """The restore points in a store (of one run), newest first. The store is listed afresh:
    no listing cache hides what another process published."""
    location = _store(store, storage_options)
    if run is not None and (not isinstance(run, str) or not _RUN.fullmatch(run)):
        raise UsageError(f"not a run id: {run!r}")
    with at_url(location.url):
        scope = location.join(run) if run is not None else location
        entries = []
        for info in scope.list_objects():
            name = f"{run}/{info.name}" if run is not None else info.name
            entry = _parse(ObjectInfo(name, info.url, info.size, info.modified))
            if entry is not None:
                entries.append(entry)
    # Runs in name order; within each run, newest first.
    entries.sort(key=lambda e: e.sort_key, reverse=True)
    return sorted(entries, key=lambda e: e.run)


def _by_run(entries: Iterable[StoreEntry]) -> dict[str, list[StoreEntry]]:
    runs: dict[str, list[StoreEntry]] = {}
    for entry in entries:
        runs.setdefault(entry.run, []).append(entry)
    for items in runs.values():
        items.sort(key=lambda e: e.sort_key, reverse=True)
    return runs


def latest(
    store: str | Location,
    *,
    run: str | None = None,
    verify_it: bool = False,
    storage_options: dict[str, Any] | None = None,
    trust: Trust = NO_TRUST,
) -> StoreEntry:
    """The newest restore point of ``run`` (or of the store's only run); with ``verify_it``,
    the newest that verifies end to end. NotFound when there is none. With several runs in the
    store and no ``run``, a UsageError: resuming another run's restore point is never a guess."""
    location = _store(store, storage_options)
    entries = list_store(location, run=run)
    runs = _by_run(entries)
    if not runs:
        raise NotFound(
            "no restore point in the store" + (f" for run {run}" if run else ""), url=location.url
        )
    if len(runs) > 1:
        raise UsageError(
            f"the store holds {len(runs)} runs ({', '.join(sorted(runs))}): give --run",
            url=location.url,
        )
    (candidates,) = runs.values()
    for entry in candidates:
        try:
            if verify_it:
                _verify_entry(location.join(entry.name), entry, trust)
            else:
                _check_name(location.join(entry.name), entry)
        except IntegrityError:
            continue  # not a sound restore point of this run: the next older one may be
        return entry
    what = "verifies" if verify_it else "has a sound head that agrees with its name"
    raise NotFound(f"no restore point of run {candidates[0].run} {what}", url=location.url)


def _check_name(location: Location, entry: StoreEntry) -> None:
    """The head must say what the name says (run, step, id): a restore point copied under
    another run's name is not that run's."""
    entry_head(location, entry)


def entry_head(location: Location, entry: StoreEntry, trust: Trust = NO_TRUST) -> Manifest:
    """The head of a store's restore point (a bounded read; with a trust policy that checks
    signatures, the signature is checked first), checked to say what its name says."""
    reader = location.reader()
    try:
        head = open_head(reader, trust).head.manifest
    finally:
        reader.close()
    _same(head, location, entry)
    return head


def _verify_entry(
    location: Location, entry: StoreEntry, trust: Trust = NO_TRUST, *, part_payloads: bool = True
) -> None:
    """Verify end to end, and that the head says what the name says."""
    _same(verify(location, trust=trust, part_payloads=part_payloads).manifest, location, entry)


def _same(head: Manifest, location: Location, entry: StoreEntry) -> None:
    if (
        head.run != entry.run
        or head.position.step != entry.step
        or not head.id.startswith(entry.id_prefix)
    ):
        raise IntegrityError(
            f"the head says run {head.run}, step {head.position.step}, id {head.id[:12]}; "
            f"its name says run {entry.run}, step {entry.step}, id {entry.id_prefix}",
            url=location.url,
        )


# -- prune ----------------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"([0-9]+)([smhdw])")


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``6h``, ``7d``, ``2w``, or sums like ``1d12h``, in seconds."""
    text = text.strip().lower()
    pos = 0
    total = 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += int(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise UsageError(f"not a duration: {text!r} (use e.g. 90s, 30m, 6h, 7d, 2w, 1d12h)")
    return total


@dataclass(frozen=True)
class KeepBest:
    """Retention by metric (spec 19.5): keep the ``k`` restore points of each run whose head
    records ``metric`` with the lowest (``mode="min"``) or highest (``"max"``) value."""

    k: int
    metric: str
    mode: str = "min"

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise UsageError("--keep-best must be at least 1")
        if not isinstance(self.metric, str) or not METRIC_NAME.fullmatch(self.metric):
            raise UsageError(
                "--metric must be a metric name: 1 to 64 letters, digits, '.', '_', '/' or '-'"
            )
        if self.mode not in ("min", "max"):
            raise UsageError("--mode must be min or max")

    @classmethod
    def of(
        cls, k: int | None, metric: str | None, mode: str | None, option: str = "--metric"
    ) -> KeepBest | None:
        """The rule the options give, or None; a metric or mode without a count (or a count
        without a metric) is a UsageError. ``option``: what the caller calls the metric."""
        if k is None:
            if metric is not None or mode is not None:
                raise UsageError(f"{option} and --mode go with --keep-best")
            return None
        if metric is None:
            raise UsageError(f"--keep-best needs {option} NAME")
        return cls(k, metric, mode or "min")

    @property
    def reason(self) -> str:
        return f"keep-best {self.k} {self.metric} {self.mode}"

    def to_text(self) -> str:
        """``K METRIC MODE``: how a supervisor hands the rule to its trainer (environment)."""
        return f"{self.k} {self.metric} {self.mode}"

    @classmethod
    def from_text(cls, text: str) -> KeepBest:
        words = text.split(" ")
        if len(words) != 3 or not words[0].isdigit():
            raise UsageError(f"not a keep-best rule (K METRIC MODE): {text!r}")
        return cls(int(words[0]), words[1], words[2])


@dataclass
class RunPlan:
    """What prune decided for one run: each kept restore point with the rules that keep it."""

    run: str
    keep: list[tuple[StoreEntry, list[str]]] = field(default_factory=list)
    delete: list[StoreEntry] = field(default_factory=list)
    verified: str | None = None  # name of the newest restore point that verifies
    unverified: list[str] = field(default_factory=list)  # names that failed verification

    def to_dict(self) -> dict[str, Any]:
        return {
            "delete": [e.to_dict() for e in self.delete],
            "failed_verification": self.unverified,
            "keep": [{**e.to_dict(), "reasons": reasons} for e, reasons in self.keep],
            "newest_verified": self.verified,
            "run": self.run,
        }


@dataclass
class PruneReport:
    store: str
    dry_run: bool
    runs: list[RunPlan]
    deleted: list[str]
    leftovers: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "deleted": self.deleted,
            "dry_run": self.dry_run,
            "leftovers": self.leftovers,
            "ok": True,
            "runs": [r.to_dict() for r in self.runs],
            "store": self.store,
        }


def _plan_run(  # noqa: PLR0912, PLR0913 - one run's retention rules, each a branch of spec 20
    location: Location,
    run: str,
    entries: list[StoreEntry],
    *,
    keep_last: int | None,
    keep_every: int | None,
    keep_within: float | None,
    verify_entry: Callable[[Location, StoreEntry], None],
    protect: AbstractSet[str] = frozenset(),
    keep_best: KeepBest | None = None,
    metric_of: Callable[[Location, StoreEntry], float | None] | None = None,
    resumed: AbstractSet[str] = frozenset(),
) -> RunPlan:
    """Retention for one run, newest first. Protected whatever the rules say: the newest
    restore point, the newest one that verifies, everything newer than that one, and what a
    live run resumed from."""
    plan = RunPlan(run)
    reasons: dict[str, list[str]] = {e.name: [] for e in entries}
    reasons[entries[0].name].append("newest")
    for entry in entries:
        try:
            verify_entry(location.join(entry.name), entry)
        except IntegrityError:
            plan.unverified.append(entry.name)
            reasons[entry.name].append("newer than the newest that verifies")
            continue
        plan.verified = entry.name
        reasons[entry.name].append("newest that verifies")
        break
    if keep_last:
        for entry in entries[:keep_last]:
            reasons[entry.name].append(f"keep-last {keep_last}")
    if keep_every:
        seen: set[int] = set()
        for entry in entries:
            bucket = entry.step // keep_every
            if bucket not in seen:
                seen.add(bucket)
                reasons[entry.name].append(f"keep-every {keep_every}")
    if keep_within is not None:
        newest = entries[0].created_at
        for entry in entries:
            if newest - entry.created_at <= keep_within:
                reasons[entry.name].append("keep-within")
    if keep_best is not None and metric_of is not None:
        for entry in _best(location, entries, keep_best, metric_of):
            reasons[entry.name].append(keep_best.reason)
    for entry in entries:
        if entry.name in protect:
            reasons[entry.name].append("just published")
        if entry.name in resumed:
            reasons[entry.name].append("resumed from by a live run")
    keep_bases(location, entries, reasons)
    for entry in entries:
        if reasons[entry.name]:
            plan.keep.append((entry, reasons[entry.name]))
        else:
            plan.delete.append(entry)
    # Oldest first: a prune killed half-way has removed only what it meant to.
    plan.delete.sort(key=lambda e: e.sort_key)
    return plan


def _best(
    location: Location,
    entries: list[StoreEntry],
    rule: KeepBest,
    metric_of: Callable[[Location, StoreEntry], float | None],
) -> list[StoreEntry]:
    """The ``rule.k`` best restore points of a run by ``rule.metric``; one whose head does not
    record it (or cannot be read) is never among them. Ties go to the newer."""
    scored = []
    for order, entry in enumerate(entries):  # newest first
        value = metric_of(location.join(entry.name), entry)
        if value is not None:
            scored.append((value if rule.mode == "min" else -value, order, entry))
    scored.sort(key=lambda item: (item[0], item[1]))
    return [entry for _, _, entry in scored[: rule.k]]


def _metric(rule: KeepBest, trust: Trust) -> Callable[[Location, StoreEntry], float | None]:
    def metric_of(location: Location, entry: StoreEntry) -> float | None:
        try:
            head = entry_head(location, entry, trust)
        except (IntegrityError, NotFound):
            return None  # not a sound head of this run (or gone since the listing): never best
        value = head.metrics.get(rule.metric)
        return None if value is None else float(value)

    return metric_of


def prune(  # noqa: PLR0913 - public API: the retention rules as keywords
    store: str | Location,
    *,
    keep_last: int | None = None,
    keep_every: int | None = None,
    keep_within: str | float | None = None,
    keep_best: int | KeepBest | None = None,
    metric: str | None = None,
    mode: str | None = None,
    run: str | None = None,
    dry_run: bool = False,
    grace: str | float = DEFAULT_GRACE_S,
    storage_options: dict[str, Any] | None = None,
    now: float | None = None,
    protect: Iterable[str] = (),
    trust: Trust = NO_TRUST,
    parts_verified: Iterable[str] = (),
) -> PruneReport:
    """Apply the retention rules to each run (or to ``run`` only) and clean leftovers of
    interrupted uploads older than ``grace``. See the module docstring for what is never
    deleted; ``protect`` adds store names that are kept whatever the rules say (pack protects
    the restore point it has just published, even when an older run step sorts above it).
    ``parts_verified``: commits just published whose parts' payloads their own ranks read back
    and verified; their parts are checked here up to the payload only (spec 25.5).
    ``keep_best`` with ``metric`` and ``mode`` (min, the default, or max), or a KeepBest: also
    keep the best restore points by a metric their heads record. What a live run resumed from
    (a resume marker, spec 19.9) is kept whatever the rules say."""
    best = keep_best if isinstance(keep_best, KeepBest) else KeepBest.of(keep_best, metric, mode)
    if keep_last is None and keep_every is None and keep_within is None and best is None:
        raise UsageError(
            "prune needs a rule: --keep-last, --keep-every, --keep-within or --keep-best"
        )
    if keep_last is not None and keep_last < 1:
        raise UsageError("--keep-last must be at least 1")
    if keep_every is not None and keep_every < 1:
        raise UsageError("--keep-every must be at least 1 step")
    within = parse_duration(keep_within) if isinstance(keep_within, str) else keep_within
    grace_s = parse_duration(grace) if isinstance(grace, str) else float(grace)
    location = _store(store, storage_options)
    by_ranks = frozenset(parts_verified)
    clock = now if now is not None else time.time()
    with at_url(location.url):
        runs = _by_run(list_store(location, run=run))
        scope = location.join(run) if run is not None else location
        resumed = live_markers(
            location,
            (
                ObjectInfo(f"{run}/{i.name}" if run is not None else i.name, i.url, i.size, None)
                for i in scope.list_objects()
            ),
            clock,
        )
        plans = [
            _plan_run(
                location,
                name,
                entries,
                keep_last=keep_last,
                keep_every=keep_every,
                keep_within=within,
                verify_entry=lambda loc, entry: _verify_entry(
                    loc, entry, trust, part_payloads=entry.name not in by_ranks
                ),
                protect=set(protect),
                keep_best=best,
                metric_of=_metric(best, trust) if best is not None else None,
                resumed=resumed,
            )
            for name, entries in sorted(runs.items())
        ]
        deleted: list[str] = []
        if not dry_run:
            for plan in plans:
                for entry in plan.delete:
                    # The commit first: once it is gone its parts are no restore point's,
                    # and a prune killed in between leaves only leftovers (spec 25.5).
                    location.join(entry.name).delete()
                    deleted.append(entry.url)
                    for info in location.join(parts_prefix(entry.name)).list_objects():
                        location.join(f"{parts_prefix(entry.name)}/{info.name}").delete()
        leftovers = _leftovers(location, run, grace_s, clock, dry_run)
    return PruneReport(location.url, dry_run, plans, deleted, leftovers)


def _orphan_part(name: str, names: AbstractSet[str]) -> bool:
    """Whether ``name`` is an object under a commit's parts prefix whose commit is not in
    ``names`` (the same listing)."""
    prefix, _, _ = name.rpartition("/")
    if not prefix.endswith(PARTS_SUFFIX):
        return False
    stem = prefix.removesuffix(PARTS_SUFFIX)
    return _NAME.match(stem.rsplit("/", 1)[-1] + ".rp") is not None and stem + ".rp" not in names


def _leftovers(  # noqa: PLR0913 - K5's scope, GRACE, clock and mode, and a listing to reuse
    location: Location,
    run: str | None,
    grace_s: float,
    now: float,
    dry_run: bool,
    *,
    listing: list[ObjectInfo] | None = None,
    uploads: bool = True,
) -> list[str]:
    """Partial names and incomplete uploads older than the grace period: never a live one.
    ``listing``: the scope's listing, made by the caller (fsck selects from the listing it
    checks, one run at a time); ``uploads``: look at the incomplete uploads too."""
    scope = location.join(run) if run is not None else location
    out = []
    listing = scope.list_objects() if listing is None else listing
    names = {info.name for info in listing}
    for info in listing:
        if _orphan_part(info.name, names):
            # A part whose commit is not there: a snapshot that never committed (a rank
            # killed), or a commit deleted. GRACE keeps the parts of one still committing.
            if info.modified is None or now - info.modified < grace_s:
                continue
            out.append(info.url)
            if not dry_run:
                scope.join(info.name).delete()
            continue
        partial = parse_partial(info.name.rsplit("/", 1)[-1])
        if partial is None:
            continue
        if info.modified is None or now - info.modified < grace_s:
            continue
        if location.abilities.atomic_rename and partial.writer_alive:
            continue
        out.append(info.url)
        if not dry_run:
            scope.join(info.name).delete()
    for upload in scope.pending_uploads() if uploads else ():
        if upload.initiated is None or now - upload.initiated < grace_s:
            continue
        out.append(f"{upload.url} (incomplete upload {upload.upload_id})")
        if not dry_run:
            scope.abort_upload(upload)
    return out
