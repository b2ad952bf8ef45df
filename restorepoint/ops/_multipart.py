"""Reading multi-part restore points (spec section 25): where a commit's parts lie, and
whether a part read is the one its commit names. Used by verify, import and prune; publishing
is ``ops.parts``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import IntegrityError
from ..format import Manifest, PartRef, check_paths
from ..storage import Location
from ..trust import Trust

__all__ = [
    "PARTS_SUFFIX",
    "check_part",
    "check_part_paths",
    "missing_part",
    "part_location",
    "part_trust",
    "parts_prefix",
]

#: A commit ``STEM.rp`` keeps its parts under ``STEM.parts/``.
PARTS_SUFFIX = ".parts"


def parts_prefix(commit_name: str) -> str:
    """The prefix of a commit's parts: its name without ``.rp``, then ``.parts``."""
    return commit_name.removesuffix(".rp") + PARTS_SUFFIX


def part_location(commit: Location, ref: PartRef) -> Location:
    """Where the part ``ref`` of the commit at ``commit`` lies."""
    stem = commit.url.rstrip("/").rsplit("/", 1)[-1]
    return commit.beside(f"{parts_prefix(stem)}/{ref.name}")


def check_part(  # noqa: PLR0913 - the commit, the part's reference and what was read of it
    commit: Manifest,
    ref: PartRef,
    part: Manifest,
    *,
    digest: str,
    size: int,
    url: str,
) -> None:
    """The part read at ``url`` is the one ``commit`` names: its digest (which pins its head
    and index), size and id (never the commit's own), and its head names the commit, the rank,
    the world size, and says what the commit says of the run, the position, the time and
    everything the gate compares (trainer, terms, cache root, cache keys, config identity,
    operational keys): the gate's decision on the commit holds for every part. Anything else
    is an IntegrityError."""
    assert commit.parts is not None
    if part.id == commit.id:
        raise IntegrityError(f"part {ref.name} has its commit's id", url=url, found=part.id)
    expected: list[tuple[str, Any, Any]] = [
        ("digest", ref.digest, digest),
        ("size", ref.size, size),
        ("id", ref.id, part.id),
        ("commit", commit.id, part.part.commit if part.part else None),
        ("rank", ref.rank, part.part.rank if part.part else None),
        ("world size", commit.parts.world_size, part.part.world_size if part.part else None),
        ("run", commit.run, part.run),
        ("position", commit.position, part.position),
        ("created", commit.created, part.created),
        ("trainer", commit.trainer, part.trainer),
        ("terms", dict(commit.terms), dict(part.terms)),
        ("cache root", commit.cache_root, part.cache_root),
        ("cache keys", dict(commit.cache_keys), dict(part.cache_keys)),
        ("config identity", commit.config_identity, part.config_identity),
        ("operational keys", commit.operational_keys, part.operational_keys),
    ]
    for what, want, found in expected:
        if want != found:
            raise IntegrityError(
                f"part {ref.name} is not the one its commit names ({what} differs)",
                url=url,
                expected=str(want),
                found=str(found),
            )


def check_part_paths(parts: Iterable[Manifest]) -> None:
    """The parts' files together follow the path rules, as one payload's would: no two parts
    hold the same path, or a path and a directory of the same name (spec 25.3). UnsafePath
    otherwise."""
    paths = [e.path for m in parts for e in m.payload or ()]
    check_paths(sorted(paths, key=lambda p: p.encode()))


def missing_part(ref: PartRef, url: str) -> IntegrityError:
    """A commit whose part is gone is no sound restore point (a part deleted by hand)."""
    return IntegrityError(f"part {ref.name} of this commit is missing", url=url)


def part_trust(trust: Trust) -> Trust:
    """A part is trusted through its commit (whose signature covers its digest); only the
    identity that opens an encrypted payload carries over."""
    return Trust(identity=trust.identity)
