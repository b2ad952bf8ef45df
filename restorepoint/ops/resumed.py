"""Resume markers: how a live run tells prune which restore point it resumed from (spec 19.9).

A run that resumes from a store's restore point writes ``STORE/RUN/.resumed-HOLDER.json``, a
small canonical JSON object naming the restore point and when the lease ends, and renews it as
it goes; it removes it when it ends. Prune keeps every restore point a live marker names. A
marker whose lease has run out protects nothing, so a run that died never pins a restore point
for longer than its lease. Markers are read as hostile data: bounded, strictly parsed, and one
that is malformed, names something that is no restore point of its run, or claims a lease longer
than MAX_LEASE_S protects nothing.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import IntegrityError, NotFound, RestorePointError
from ..format import canonical_dumps, strict_loads
from ..storage import Location, ObjectInfo
from ._naming import NAME_PATTERN, RUN_PATTERN

__all__ = [
    "DEFAULT_LEASE_S",
    "MAX_LEASE_S",
    "MAX_MARKER_BYTES",
    "ResumeMarker",
    "is_marker_name",
    "live_markers",
]

#: How long a marker protects after it is written or renewed: a run renews it at each publish,
#: so a run that publishes nothing for longer loses the protection (spec 19.9).
DEFAULT_LEASE_S = 24 * 3600
#: A marker that says its lease ends later than this after now protects nothing: no object in a
#: store can pin a restore point for ever.
MAX_LEASE_S = 7 * 24 * 3600
#: A marker is a few dozen bytes; a larger object under a marker's name is not read.
MAX_MARKER_BYTES = 4096
_MARKER = re.compile(r"^\.resumed-([0-9a-f]{32})\.json\Z")


def is_marker_name(name: str) -> bool:
    """Whether ``name`` (the last component of a store object) is a resume marker's."""
    return _MARKER.fullmatch(name) is not None


@dataclass
class ResumeMarker:
    """One live run's marker in ``store`` (a Location of the store prefix): ``name`` is the
    store name (``RUN/STEM.rp``) of the restore point it resumed from."""

    store: Location
    name: str
    lease_s: float = DEFAULT_LEASE_S
    holder: str = ""

    def __post_init__(self) -> None:
        run, _, stem = self.name.partition("/")
        if not RUN_PATTERN.fullmatch(run) or not NAME_PATTERN.match(stem) or "/" in stem:
            raise ValueError(f"not a store name: {self.name!r}")
        if not 0 < self.lease_s <= MAX_LEASE_S:
            raise ValueError(f"a lease is from 1 s to {MAX_LEASE_S} s")
        self.holder = self.holder or secrets.token_hex(16)
        self._location = self.store.join(f"{run}/.resumed-{self.holder}.json")

    @property
    def url(self) -> str:
        return self._location.url

    def renew(self, now: float | None = None) -> None:
        """Write (or rewrite) the marker with a lease from now. A StorageError is the caller's:
        a run goes on without its protection rather than stop."""
        expires = int((time.time() if now is None else now) + self.lease_s)
        data = canonical_dumps({"expires": expires, "name": self.name})
        with self._location.publish(size_hint=len(data)) as pub:
            pub.write(data)

    def release(self) -> None:
        """Remove the marker (the run ended); a failure leaves it to expire."""
        with contextlib.suppress(RestorePointError, OSError):
            self._location.delete()


def _read(location: Location, info: ObjectInfo, run: str, now: float) -> str | None:  # noqa: PLR0911 - each check of a hostile marker refuses alone
    """The store name a marker protects now, or None (expired, or not a sound marker)."""
    if info.size > MAX_MARKER_BYTES:
        return None
    reader = location.join(info.name).reader()
    try:
        data = reader.read_range(0, min(reader.size, MAX_MARKER_BYTES))
    finally:
        reader.close()
    try:
        doc: Any = strict_loads(data, "resume marker")
    except IntegrityError:
        return None
    if not isinstance(doc, dict) or set(doc) != {"expires", "name"}:
        return None
    expires, name = doc["expires"], doc["name"]
    if not isinstance(expires, int) or isinstance(expires, bool) or not isinstance(name, str):
        return None
    if not now < expires <= now + MAX_LEASE_S:
        return None
    owner, _, stem = name.partition("/")
    if owner != run or "/" in stem or not NAME_PATTERN.match(stem):
        return None
    return name


def live_markers(location: Location, listing: Iterable[ObjectInfo], now: float) -> set[str]:
    """The store names that live markers in ``listing`` (a listing of the store ``location``,
    names relative to it) protect. A marker that vanished since the listing protects nothing;
    any other StorageError is the caller's: a marker that could not be read might be live."""
    names: set[str] = set()
    for info in listing:
        run, _, leaf = info.name.partition("/")
        if "/" in leaf or not is_marker_name(leaf) or not RUN_PATTERN.fullmatch(run):
            continue
        try:
            name = _read(location, info, run, now)
        except NotFound:
            continue
        if name is not None:
            names.add(name)
    return names
