"""A ResumableRun's snapshot with a process group (runtime/publish.py's ``Publisher`` for
one process): a part per rank, then rank 0's commit (spec section 25); and a stop's choice,
made by every rank together, to give up the publish in flight (runtime/_inflight.py)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from ..errors import RestorePointError
from ..format import PartRef
from ..ops.parts import CommitPlan, publish_commit, publish_part
from ._inflight import InFlight
from .contract import POSITION_FILE
from .state import remove_other_shared, shared_file, split_shared, state_digest
from .worker import Snapshot

if TYPE_CHECKING:
    from .publish import Publisher

__all__ = ["save_and_publish_part", "supersede_parts"]

log = logging.getLogger("restorepoint.torch")


def _gather(pub: Publisher, value: Any) -> list[Any]:
    out: list[Any] = [None] * pub.world
    torch.distributed.all_gather_object(out, value, group=pub.group)
    return out


def save_and_publish_part(pub: Publisher, snap: Snapshot) -> None:
    """Every rank, on its worker: agree on the commit and on what every rank holds alike,
    save (the shared state once, named by its content, and the rank's own), publish the
    rank's part (rank 0: and the shared part), then rank 0, once every part is in, the
    commit. Every rank takes part in every collective, whatever fails on the way: a rank
    that fails (or dies: the collective then fails) leaves no commit, and the previous
    restore point stays the newest. A stop's newer snapshot may give up the rank's part in
    flight (``supersede_parts``: every rank does, or none): the parts then fail, no commit is
    made, and it is recorded as superseded, not as a failure."""
    started = time.perf_counter()
    flight = pub._flights.begin(snap.position.step)
    try:
        if _job(pub, snap, flight):
            pub._flights.landed(time.perf_counter() - started)
    finally:
        pub._flights.end()


def supersede_parts(pub: Publisher, newer: int, group: Any) -> dict[str, float] | None:
    """A stop's snapshot at step ``newer``, on every rank's training thread at the same
    boundary (a collective on ``group``): every rank's view of its part in flight gathered,
    and where they agree (``Flights.supersede``), every rank gives it up. The figures the
    choice was made on (with ``by``), or None."""
    views: list[Any] = [None] * pub.world
    torch.distributed.all_gather_object(views, pub._flights.view(newer), group=group)
    return pub._flights.supersede(newer, pub.options.deadline_margin, views)


def _job(pub: Publisher, snap: Snapshot, flight: InFlight) -> bool:
    """``save_and_publish_part``'s work; whether the rank's publish landed (rank 0: the
    commit; another rank: every part in), which is what the next estimates are made of."""
    box = [CommitPlan.new(pub.world).to_dict() if pub.is_main else None]
    torch.distributed.broadcast_object_list(box, src=0, group=pub.group)
    assert isinstance(box[0], dict)
    plan = CommitPlan.from_dict(box[0])
    objects = snap.state["objects"]
    digests = _gather(pub, {name: state_digest(value) for name, value in objects.items()})
    shared = {
        name: digest
        for name, digest in digests[0].items()
        if digest is not None and all(d.get(name) == digest for d in digests)
    }
    checkpoints = pub.directory.checkpoints
    own: list[str] = [pub.rank_file()]
    common: list[str] = []
    refs: tuple[PartRef | None, PartRef | None] = (None, None)
    error = ""
    saved = False
    try:
        state = snap.state
        if shared:
            name = shared_file(shared)
            state, common_state = split_shared(snap.state, sorted(shared), name)
            pub._save(snap, checkpoints / name, common_state, sidecar=False)
            common = [name]
        pub._save(snap, checkpoints / pub.rank_file(), state)
        saved = True
        if shared:
            remove_other_shared(checkpoints, common[0])
        if pub.store is not None:
            refs = _publish_parts(pub, snap, plan, own, common, flight)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        if not flight.superseded:
            log.warning("snapshot at step %d failed: %s", snap.position.step, error)
        if not saved:
            pub.save_errors[snap.position.step] = str(exc)
    if pub.store is None:
        return False
    gathered = _gather(pub, (refs, error))
    step = snap.position.step
    failed = [f"rank {r}: {e}" for r, (_, e) in enumerate(gathered) if e]
    if not pub.is_main:
        if error and not flight.superseded:
            pub.event("upload_failed", step=step, error=error)
        return not failed
    if failed and flight.superseded:
        # Every rank gave it up for a stop's newer snapshot (``supersede_parts`` said so).
        pub.uploads.append(
            {"ok": False, "step": step, "error": "; ".join(failed), "superseded": True}
        )
        return False
    if failed:
        pub.uploads.append({"ok": False, "step": step, "error": "; ".join(failed)})
        pub.event("upload_failed", step=step, error="; ".join(failed))
        return False
    parts = [ref for pair, _ in gathered for ref in pair if ref is not None]
    return _publish_commit(pub, snap, plan, parts)


def _publish_parts(  # noqa: PLR0913, PLR0917 - the snapshot, its commit, its files, its flight
    pub: Publisher,
    snap: Snapshot,
    plan: CommitPlan,
    own: list[str],
    common: list[str],
    flight: InFlight,
) -> tuple[PartRef | None, PartRef | None]:
    """This rank's part; on rank 0 also the shared part (the shared state and the
    position), or the position in its own part when nothing is shared. Each pack raises at
    its next chunk once ``flight`` is given up."""
    head = pub.head(snap.position, snap.metrics)
    options = pub._options()
    mine, shared = own, None
    if pub.is_main:
        if common:
            shared = [*common, POSITION_FILE]
        else:
            mine = [*own, POSITION_FILE]

    def part(include: list[str], rank: int | None) -> PartRef:
        return publish_part(
            pub.directory.checkpoints,
            pub.store or "",
            head,
            plan,
            rank=rank,
            options=options,
            include=include,
            # With a prune after the commit, each rank reads its own part back, so that
            # the prune need not read every rank's bytes on rank 0 (spec 25.5).
            verify_it=pub.prunes,
            rest=pub.rest,
            progress=flight.abandon,
        )

    return part(mine, pub.rank), part(shared, None) if shared else None


def _publish_commit(pub: Publisher, snap: Snapshot, plan: CommitPlan, parts: list[PartRef]) -> bool:
    started = time.perf_counter()
    step = snap.position.step
    try:
        result = publish_commit(
            pub.store or "",
            pub.head(snap.position, snap.metrics),
            plan,
            parts,
            pub.options,
            keep_last=pub.keep_last,
            keep_best=pub.keep_best,
            parts_verified=pub.prunes and not pub.options.encrypt_to,
        )
    except RestorePointError as exc:
        pub.uploads.append({"ok": False, "step": step, "error": str(exc)})
        pub.event("upload_failed", step=step, error=exc.message)
        return False
    seconds = time.perf_counter() - started
    pub.uploads.append({"ok": True, "step": step, "url": result.url, "seconds": seconds})
    pub.renew_marker()
    pub.event("uploaded", step=step, seconds=round(seconds, 6), parts=len(parts))
    return True
