"""fsck: check a whole store, the way ``restic check`` checks a repository (spec 19.8).

    list once  ->  prune's leftover selection (a dry run) on that listing
               ->  classify every object by its name (restore point, part, leftover, stray)
               ->  verify each restore point, one at a time (head and index; --read-data: payloads)
               ->  parts whose commit is gone, parts no commit names, commits missing a part
               ->  open multipart uploads
               ->  with --repair only: prune's own leftover cleanup (19.5, K5), nothing else

Memory: one run's listing at a time (the store's listing streams, grouped by run, from local
paths and S3), one small record per finding, and the open uploads; a restore point's head and
index are read, checked and dropped before the next one. A store of 100k objects in many runs
costs what its largest run's names cost, never what the store's or its heads do.

What fsck may remove is exactly what prune removes as leftovers, because it is prune's code
that removes it (``store._leftovers``): partial names, parts whose commit is gone, and open
multipart uploads, each past GRACE. A restore point that fails verification, a part that its
commit does not name and an object that is not a restore point are reported and never touched:
only a person knows whether they are the last copy of something.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from ..errors import IntegrityError, NotFound, at_url
from ..format.delta import base_holder
from ..storage import Location, ObjectInfo, parse_partial
from ._delta import bases_of
from ._multipart import PARTS_SUFFIX, parts_prefix
from ._naming import NAME_PATTERN, RUN_PATTERN
from ._open import NO_TRUST, Trust
from .resumed import is_marker_name
from .store import DEFAULT_GRACE_S, _leftovers, _parse, _same, _store, parse_duration
from .verify import verify

__all__ = ["KINDS", "Finding", "FsckReport", "fsck"]

#: What fsck finds, in the order it reports them.
KINDS = (
    "damaged",
    "missing_part",
    "dangling_reference",
    "orphan_part",
    "leftover",
    "upload",
    "stray",
)


@dataclass(frozen=True)
class Finding:
    """One object (or upload) that is not a sound restore point of the store.

    ``removable``: prune's leftover cleanup (and so ``fsck --repair``) removes it now.
    ``pending``: a leftover, part or upload younger than GRACE (or whose local writer lives):
    it may belong to a publish in progress, so it is reported but is no defect yet."""

    kind: str
    name: str  # relative to the store ("" for an upload, which has only its key)
    url: str
    detail: str
    error: str | None = None  # the error class, for a restore point that fails
    removable: bool = False
    pending: bool = False
    #: How prune's leftover cleanup names it (a URL; for an upload ``URL (incomplete upload ID)``).
    cleanup_name: str = ""

    def __post_init__(self) -> None:
        if not self.cleanup_name:
            object.__setattr__(self, "cleanup_name", self.url)

    def to_dict(self) -> dict[str, Any]:
        return {
            "detail": self.detail,
            "error": self.error,
            "kind": self.kind,
            "name": self.name,
            "pending": self.pending,
            "removable": self.removable,
            "url": self.url,
        }


@dataclass
class FsckReport:
    store: str
    read_data: bool
    grace_s: float
    objects: int = 0
    restore_points: int = 0
    sound: int = 0
    findings: list[Finding] = field(default_factory=list)
    repaired: list[str] | None = None  # None: no --repair

    @property
    def defects(self) -> list[Finding]:
        """Findings that are defects (not pending), less what the repair removed."""
        gone = set(self.repaired or ())
        return [f for f in self.findings if not f.pending and f.cleanup_name not in gone]

    def repaired_findings(self) -> set[str]:
        """The ``cleanup_name`` of each finding that ``--repair`` removed."""
        return set(self.repaired or ())

    @property
    def clean(self) -> bool:
        return not self.defects

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for finding in self.findings:
            if not finding.pending:
                out[finding.kind] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "counts": self.counts(),
            "defects": len(self.defects),
            "findings": [f.to_dict() for f in self.findings],
            "grace_s": self.grace_s,
            "objects": self.objects,
            "ok": self.clean,
            "pending": sum(f.pending for f in self.findings),
            "read_data": self.read_data,
            "repaired": self.repaired,
            "restore_points": {
                "checked": self.restore_points,
                "damaged": self.restore_points - self.sound,
                "sound": self.sound,
            },
            "store": self.store,
        }


def _part_of(name: str) -> str | None:
    """The commit's store name when ``name`` lies under a commit's parts prefix."""
    prefix, _, _ = name.rpartition("/")
    if not prefix.endswith(PARTS_SUFFIX):
        return None
    stem = prefix.removesuffix(PARTS_SUFFIX)
    return stem + ".rp" if NAME_PATTERN.match(stem.rsplit("/", 1)[-1] + ".rp") else None


def fsck(  # noqa: PLR0913 - public API: the check's keyword options
    store: str | Location,
    *,
    read_data: bool = False,
    repair: bool = False,
    grace: str | float = DEFAULT_GRACE_S,
    storage_options: dict[str, Any] | None = None,
    now: float | None = None,
    trust: Trust = NO_TRUST,
) -> FsckReport:
    """Check every object of ``store`` (spec 19.8); with ``repair``, remove what prune's
    leftover cleanup removes and nothing else. A store that cannot be listed or read raises
    its StorageError; what is wrong with the objects is in the report, never raised."""
    grace_s = parse_duration(grace) if isinstance(grace, str) else float(grace)
    now = time.time() if now is None else now
    location = _store(store, storage_options)
    report = FsckReport(location.url, read_data, grace_s)
    repaired: list[str] = []
    with at_url(location.url):
        # One run's objects at a time (the listing streams them grouped by their top-level
        # name): memory follows the largest run, never the store.
        for _, group in itertools.groupby(location.iter_objects(), key=_top):
            listing = list(group)
            report.objects += len(listing)
            _check_group(location, listing, grace_s, now, report, trust)
            if repair:
                # Prune's cleanup (K5) on the same listing, not a copy of it: fsck removes
                # only what prune removes.
                repaired += _leftovers(
                    location, None, grace_s, now, dry_run=False, listing=listing, uploads=False
                )
        removable = set(_leftovers(location, None, grace_s, now, dry_run=True, listing=[]))
        for upload in location.pending_uploads():
            token = f"{upload.url} (incomplete upload {upload.upload_id})"
            young = upload.initiated is None or now - upload.initiated < grace_s
            report.findings.append(
                Finding(
                    "upload",
                    upload.name,
                    upload.url,
                    f"open multipart upload {upload.upload_id}",
                    removable=token in removable,
                    pending=young and token not in removable,
                    cleanup_name=token,
                )
            )
        if repair:
            repaired += _leftovers(location, None, grace_s, now, dry_run=False, listing=[])
            report.repaired = repaired
    report.findings.sort(key=lambda f: (KINDS.index(f.kind), f.name, f.url))
    return report


def _top(info: ObjectInfo) -> str:
    return info.name.partition("/")[0]


def _check_group(  # noqa: PLR0913, PLR0917 - one run's listing, and what the check is given
    location: Location,
    listing: list[ObjectInfo],
    grace_s: float,
    now: float,
    report: FsckReport,
    trust: Trust,
) -> None:
    """C2 to C4 on the objects under one top-level name (a run, or one object at the top):
    a part and its commit always lie under the same run."""
    # What prune would remove now, by prune's own selection from this listing (a dry run
    # deletes nothing); the open uploads are the store's, looked at once, after.
    removable = set(
        _leftovers(location, None, grace_s, now, dry_run=True, listing=listing, uploads=False)
    )
    commits: set[str] = set()
    parts: dict[str, list[str]] = {}  # commit's store name -> its listed parts
    for info in listing:
        if _classify(location, info, removable, grace_s, now, report):
            commits.add(info.name)
        elif (commit := _part_of(info.name)) is not None and not _is_partial(info.name):
            parts.setdefault(commit, []).append(info.name)
    for commit, names in sorted(parts.items()):
        if commit in commits:
            continue
        for name in sorted(names):
            url = location.join(name).url
            report.findings.append(
                _pending_or_not(
                    Finding("orphan_part", name, url, f"its commit {commit} is not in the store"),
                    url in removable,
                )
            )
    for name in sorted(commits):
        _check_restore_point(location, name, parts.get(name, []), report, trust, commits)


def _pending_or_not(finding: Finding, removable: bool) -> Finding:
    """A leftover or orphan part prune would not remove yet is younger than GRACE, or its
    writer lives: pending, not a defect. One it removes is a defect that --repair clears."""
    return Finding(
        finding.kind,
        finding.name,
        finding.url,
        finding.detail,
        removable=removable,
        pending=not removable,
        cleanup_name=finding.cleanup_name,
    )


def _is_marker(name: str) -> bool:
    run, _, leaf = name.partition("/")
    return "/" not in leaf and is_marker_name(leaf) and RUN_PATTERN.fullmatch(run) is not None


def _classify(  # noqa: PLR0913, PLR0917 - one listed object, and what decides its class
    location: Location,
    info: ObjectInfo,
    removable: set[str],
    grace_s: float,
    now: float,
    report: FsckReport,
) -> bool:
    """Record a leftover or a stray; True for a restore point (a commit), False otherwise."""
    url = location.join(info.name).url
    partial = parse_partial(info.name.rsplit("/", 1)[-1])
    if partial is not None:
        young = info.modified is None or now - info.modified < grace_s
        why = "younger than the grace period" if young else "a writer on this host is alive"
        detail = "an interrupted publish's temporary object" + (
            "" if url in removable else f" ({why})"
        )
        report.findings.append(
            _pending_or_not(Finding("leftover", info.name, url, detail), url in removable)
        )
        return False
    if _parse(info) is not None:
        return True
    if _is_marker(info.name):
        return False  # a live run's resume marker (spec 19.9): prune reads it, nothing removes it
    if _part_of(info.name) is None:
        report.findings.append(Finding("stray", info.name, url, "not a restore point"))
    return False


def _is_partial(name: str) -> bool:
    return parse_partial(name.rsplit("/", 1)[-1]) is not None


def _check_restore_point(  # noqa: PLR0913, PLR0917 - one restore point, and its run's listing
    location: Location,
    name: str,
    parts: list[str],
    report: FsckReport,
    trust: Trust,
    listed: AbstractSet[str] = frozenset(),
) -> None:
    """Verify one restore point (and its parts) as the report asks; record what fails.
    ``parts``: the objects listed under its parts prefix; ``listed``: the restore points of
    its run in the listing, where every base it references must be (spec 28.5)."""
    entry = _parse(ObjectInfo(name, location.join(name).url, 0, None))
    assert entry is not None
    where = location.join(name)
    report.restore_points += 1
    # A commit's references are its parts': a part's base is held by its commit (28.7).
    dangling = [b for b in bases_of(where) if base_holder(b) not in listed]
    if dangling:
        report.findings.append(
            Finding(
                "dangling_reference",
                name,
                where.url,
                f"its base {dangling[0]} is not in the store",
                error="IntegrityError",
            )
        )
        return
    try:
        checked = verify(
            where, trust=trust, payload=report.read_data, part_payloads=report.read_data
        )
        _same(checked.manifest, where, entry)
    except NotFound as exc:
        if exc.url == where.url:
            report.restore_points -= 1  # deleted since the listing: not in the store any more
            return
        raise
    except IntegrityError as exc:
        # A part the commit names that the listing lacks: the commit is missing a part.
        listed = {location.join(p).url for p in parts}
        under = location.join(parts_prefix(name) + "/-").url[:-1]
        missing = exc.url is not None and exc.url.startswith(under) and exc.url not in listed
        report.findings.append(
            Finding(
                "missing_part" if missing else "damaged",
                name,
                where.url,
                exc.message,
                error=type(exc).__name__,
            )
        )
        return
    report.sound += 1
    # A part under this commit's prefix that the commit does not name is no restore point's:
    # prune keeps it (its commit exists), so it is a defect to look at, never removed here.
    named = {p.url for p in checked.parts}
    for part in sorted(parts):
        url = location.join(part).url
        if url not in named:
            report.findings.append(
                Finding("orphan_part", part, url, f"its commit {name} does not name it")
            )
