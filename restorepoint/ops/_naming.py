"""Store names: ``RUN/STEP-CREATED-ID.rp``, which sort by run, then step, then time."""

from __future__ import annotations

import re

from ..errors import UsageError
from ..format import Manifest
from ..format.manifest import RUN_PATTERN

__all__ = ["NAME_PATTERN", "RUN_PATTERN", "entry_name", "is_store_url", "stamp"]

#: STEP (16 digits: every step up to 2**53) - CREATED (UTC, milliseconds) - ID (12 hex) .rp
# \Z, not $: "$" also matches before a trailing newline, and "NAME.rp\n" is no store name.
NAME_PATTERN = re.compile(r"^([0-9]{16})-([0-9]{8}T[0-9]{9}Z)-([0-9a-f]{12})\.rp\Z")


def is_store_url(url: object) -> bool:
    """A DEST that ends in "/" names a store rather than a restore point."""
    return isinstance(url, str) and url.endswith("/")


def stamp(created: str) -> str:
    """``2026-12-01T09:45:12.345Z`` -> ``20261201T094512345Z`` (milliseconds, zero-padded)."""
    date, _, rest = created.partition("T")
    clock, _, frac = rest.rstrip("Z").partition(".")
    return f"{date.replace('-', '')}T{clock.replace(':', '')}{(frac + '000')[:3]}Z"


def entry_name(manifest: Manifest) -> str:
    """The store name of a restore point."""
    if manifest.run is None:
        raise UsageError("a restore point needs a run to go into a store (--run, or a --config)")
    step = manifest.position.step
    return f"{manifest.run}/{step:016d}-{stamp(manifest.created)}-{manifest.id[:12]}.rp"
