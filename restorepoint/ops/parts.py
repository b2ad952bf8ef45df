"""Multi-part restore points (spec section 25): a part per rank, and a commit published last.

    every rank:  publish_part(its files)  ->  STORE/RUN/STEM.parts/rank-RRRRR.rp  (create-only)
    rank 0:      publish_commit(the refs) ->  STORE/RUN/STEM.rp                    (create-only)

A part is an ordinary object (format 1.1, ``multipart/1``) that no listing takes for a restore
point: it lies one level deeper than store names, and its head says which commit it belongs
to. The commit is a small object with no payload whose head holds everything the gate reads
(trainer, terms, config, position, run) plus the world size and every part by its restore point
digest, which pins the part's head, its index and so each of its files' sha256. A reader
therefore sees all parts or none: the commit exists only once every part it names was
published, and a part that is not the one named (replaced, truncated, another run's) fails.

Each rank's bytes go from that rank to the store and back, never through another node: a rank
packs and uploads its own part, and imports the shared part and its own.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import IntegrityError, UsageError
from ..format import PartOf, PartRef, Parts
from ..storage import Location
from ._delta import bases_for
from ._multipart import PARTS_SUFFIX, check_part, part_location, parts_prefix
from ._naming import entry_name
from .pack import PackResult, pack_spec
from .publish import PublishResult, Rest, publish
from .spec import HeadSpec, PackOptions, created_now
from .store import KeepBest, _store
from .verify import verify

__all__ = [
    "PARTS_SUFFIX",
    "CommitPlan",
    "check_part",
    "part_location",
    "parts_prefix",
    "publish_commit",
    "publish_part",
]


@dataclass(frozen=True)
class CommitPlan:
    """What every rank agrees on before it publishes its part: the commit's id and time (so
    its store name, under which the parts go), the world size, and whether the state may be
    resumed on another world size. Rank 0 makes it and hands it to the others."""

    id: str
    created: str
    world_size: int
    reshardable: bool = False

    @classmethod
    def new(cls, world_size: int, *, reshardable: bool = False) -> CommitPlan:
        if not isinstance(world_size, int) or world_size < 1:
            raise UsageError(f"world size must be at least 1, not {world_size!r}")
        return cls(secrets.token_hex(16), created_now(), world_size, reshardable)

    def to_dict(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "id": self.id,
            "reshardable": self.reshardable,
            "world_size": self.world_size,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> CommitPlan:
        return cls(
            str(value["id"]),
            str(value["created"]),
            int(value["world_size"]),
            bool(value["reshardable"]),
        )

    def commit_name(self, spec: HeadSpec) -> str:
        """The commit's store name (``RUN/STEM.rp``): known before any part is published."""
        return entry_name(replace(spec.manifest, id=self.id, created=self.created))

    def part_spec(self, spec: HeadSpec, rank: int | None) -> HeadSpec:
        return replace(
            spec,
            part=PartOf(self.id, rank, self.world_size),
            parts=None,
            created=self.created,
            rp_id=None,
        )

    def commit_spec(self, spec: HeadSpec, refs: Sequence[PartRef]) -> HeadSpec:
        parts = Parts(self.world_size, self.reshardable, tuple(sorted(refs, key=lambda r: r.name)))
        # Checked as a reader checks it: one part per rank, names as the ranks say.
        Parts.from_dict(parts.to_dict())
        return replace(spec, parts=parts, part=None, created=self.created, rp_id=self.id)


def publish_part(  # noqa: PLR0913 - the part's source, store, head, plan, rank and options
    source: str | os.PathLike[str],
    store: str | Location,
    spec: HeadSpec,
    plan: CommitPlan,
    *,
    rank: int | None,
    options: PackOptions = PackOptions(),
    include: Sequence[str] | None = None,
    verify_it: bool = False,
    files_out: dict[str, tuple[int, str]] | None = None,
    rest: Rest | None = None,
    progress: Callable[[int], None] | None = None,
) -> PartRef:
    """Pack ``source`` (or its files ``include``) as the part of ``rank`` (None: the part all
    ranks share) of the commit ``plan`` describes, create-only under the commit's parts
    prefix. Nothing is a restore point until ``publish_commit`` names the part. With
    ``verify_it`` the part is read back and verified end to end, by this rank, before it is
    named (what lets the prune after the commit trust its payload, spec 25.5). An incremental
    part (``options.incremental``: it references its rank's part of the run's newest commit,
    spec 28.7) is checked so, or without ``verify_it`` its bases are (bounded); when that
    fails, a full part is published in its place. ``files_out``
    is filled with each packed file's size and sha256, as the part's index says them.
    ``rest``: the rank's publisher's rest, kept across its parts (spec 28.4, 28.7).
    ``progress``: the pack's hook, called with each chunk's bytes (a publish that may be
    abandoned raises there: ``ops._abandon``)."""
    if rank is not None and not 0 <= rank < plan.world_size:
        raise UsageError(f"rank {rank} is not below the world size {plan.world_size}")
    location = _store(store, options.storage_options)
    name = PartRef.name_for(rank)
    target = location.join(f"{parts_prefix(plan.commit_name(spec))}/{name}")
    result = pack_spec(
        source,
        target,
        plan.part_spec(spec, rank),
        options,
        into_store=False,
        create_only=True,
        include=include,
        rest=rest,
        progress=progress,
    )
    try:
        _check_part(target, result, verify_it=verify_it and not options.encrypt_to)
    except IntegrityError:
        if not result.manifest.bases:
            raise
        # A base pruned or changed since W4c read it (spec 28.7): nothing names this part yet,
        # so a full one takes its place under the same name.
        target.delete()
        result = pack_spec(
            source,
            target,
            plan.part_spec(spec, rank),
            replace(options, incremental=False),
            into_store=False,
            create_only=True,
            include=include,
            progress=progress,
        )
        _check_part(target, result, verify_it=verify_it and not options.encrypt_to)
    if files_out is not None and result.manifest.payload is not None:
        files_out.update({e.path: (e.size, e.sha256) for e in result.manifest.payload})
    return PartRef(name, rank, result.id, result.digest, result.size)


def _check_part(target: Location, result: PackResult, *, verify_it: bool) -> None:
    """The part just packed at ``target``, read back: end to end (through its references)
    with ``verify_it`` (an encrypted part can be read back only with a recipient's key, which
    a publisher need not hold); otherwise, for an incremental part, each base it names opened
    and checked to be the one named (head and index, bounded: spec 28.7). IntegrityError
    when it is not sound."""
    if verify_it:
        report = verify(target)
        if (report.digest, report.size) != (result.digest, result.size):
            raise IntegrityError(
                "the part read back is not the one packed", url=target.url, expected=result.digest
            )
        return
    bases = bases_for(target, result.manifest)
    if bases is None:
        return
    try:
        for base in result.manifest.bases or ():
            bases.open(base)
    finally:
        bases.close()


def publish_commit(  # noqa: PLR0913 - the commit's store, head, plan, parts and retention
    store: str,
    spec: HeadSpec,
    plan: CommitPlan,
    refs: Sequence[PartRef],
    options: PackOptions = PackOptions(),
    *,
    keep_last: int | None = None,
    keep_best: KeepBest | None = None,
    handoff: str | os.PathLike[str] | None = None,
    parts_verified: bool = False,
) -> PublishResult:
    """Publish the commit naming ``refs`` (every rank's part, and the shared one if any),
    through the one publish (spec 19.7): create-only under its store name, then the handoff,
    then the prune with it protected. Only now is there a new restore point.
    ``parts_verified``: every part was read back by its rank (``publish_part(verify_it=True)``,
    which can't read back an encrypted part), so the prune reads only their heads and indexes,
    not every rank's bytes (spec 25.5)."""
    if not store.endswith("/"):
        raise UsageError("a multi-part restore point goes into a store (a URL ending in /)")
    commit = plan.commit_spec(spec, refs)
    with tempfile.TemporaryDirectory(prefix="rp-commit-") as empty:
        return publish(
            empty,
            store,
            commit,
            options,
            keep_last=keep_last,
            keep_best=keep_best,
            handoff=handoff,
            parts_verified=parts_verified,
        )
