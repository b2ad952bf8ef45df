"""Sharded state through ``torch.distributed.checkpoint`` (DCP): a DCP checkpoint directory,
each rank's own files, becomes the parts of one multi-part restore point (spec section 25), and
a resume hands DCP its files back.

    dcp.save(state, checkpoint_id=local_dir)                    # every rank, its own directory
    url = publish_dcp(local_dir, "s3://bucket/runs/", head)      # every rank: its part; a commit
    ...
    dest = import_dcp(url, fresh_dir, views=[run.local_view()])  # every rank: what it needs
    dcp.load(state, checkpoint_id=dest)

Each rank's part holds the files it wrote (``__R_0.distcp``); the shared part holds rank 0's
``.metadata``. The state is declared reshardable: DCP reshards, so a resume on another world
size is allowed, and each rank then imports every part (DCP reads what it needs). Both calls
are collective over the default process group (or ``group``), which must be able to carry
Python objects (gloo; for NCCL give a gloo group).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import RestorePointError, StorageError
from ..format import PartRef
from ..ops import Expectations
from ..ops.parts import CommitPlan, publish_commit, publish_part
from ..ops.publish import Rest
from ..ops.resume import resume_import
from ..ops.spec import HeadSpec, PackOptions
from ..ops.store import KeepBest
from ..trust import Trust

__all__ = ["METADATA_FILE", "import_dcp", "publish_dcp", "publish_ranks"]

#: What DCP's coordinator (rank 0) writes beside its data files: every rank needs it.
METADATA_FILE = ".metadata"


def _world(group: Any) -> tuple[int, int]:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1  # one process: no collective to make
    return dist.get_rank(group), dist.get_world_size(group)


def publish_dcp(  # noqa: PLR0913 - the checkpoint, store, head, and the publish's options
    checkpoint_dir: str | os.PathLike[str],
    store: str,
    head: HeadSpec,
    *,
    options: PackOptions = PackOptions(),
    keep_last: int | None = None,
    group: Any = None,
) -> str:
    """Publish this rank's DCP files as its part, rank 0's ``.metadata`` as the shared part,
    and (rank 0, once every part is in) the commit. Returns the commit's URL on every rank;
    raises on every rank when any rank's part failed (then no commit was published)."""
    files = sorted(os.listdir(checkpoint_dir))
    return publish_ranks(
        checkpoint_dir,
        store,
        head,
        own=[f for f in files if f != METADATA_FILE],
        shared=[METADATA_FILE],
        reshardable=True,
        options=options,
        keep_last=keep_last,
        group=group,
    )


def publish_ranks(  # noqa: PLR0913 - the directory, store, head, who holds what, the options
    checkpoint_dir: str | os.PathLike[str],
    store: str,
    head: HeadSpec,
    *,
    own: Sequence[str],
    shared: Sequence[str] = (),
    reshardable: bool = False,
    options: PackOptions = PackOptions(),
    keep_last: int | None = None,
    keep_best: KeepBest | None = None,
    group: Any = None,
    files_out: dict[str, tuple[int, str]] | None = None,
    rest: Rest | None = None,
) -> str:
    """One multi-part restore point of a directory every rank wrote into (spec section 25),
    collective over ``group``: each rank publishes its files ``own`` as its part, rank 0 also
    ``shared`` (given on rank 0; none: no shared part) as the shared part, and rank 0, once
    every part is in, the commit. Returns the commit's URL on every rank; raises on every rank
    when any rank's part failed (then no commit was published). DCP's checkpoints and
    Accelerate's state directories go out this way. ``files_out`` is filled, on every rank,
    with each file of every part, its size and sha256 as the parts' indexes say them.
    ``rest``: the rank's publisher's rest, kept across its publishes (spec 28.4)."""
    dist = torch.distributed
    rank, world = _world(group)
    alone = world == 1 and not dist.is_initialized()
    box: list[Any] = [
        CommitPlan.new(world, reshardable=reshardable).to_dict() if rank == 0 else None
    ]
    if not alone:
        dist.broadcast_object_list(box, src=0, group=group)
    plan = CommitPlan.from_dict(box[0])
    # With a prune after the commit each rank reads its own part back (spec 25.5); an
    # encrypted part can't be read back without a recipient's key, and the prune then reads
    # every part as usual.
    check = (keep_last is not None or keep_best is not None) and not options.encrypt_to
    refs: list[dict[str, Any]] = []
    error = ""
    files: dict[str, tuple[int, str]] = {}

    def part(include: list[str], part_rank: int | None) -> dict[str, Any]:
        return publish_part(
            checkpoint_dir,
            store,
            head,
            plan,
            rank=part_rank,
            options=options,
            include=include,
            verify_it=check,
            files_out=files,
            rest=rest,
        ).to_dict()

    try:
        refs.append(part(list(own), rank))
        if rank == 0 and shared:
            refs.append(part(list(shared), None))
    except RestorePointError as exc:
        error = f"rank {rank}: {type(exc).__name__}: {exc.message}"
    gathered: list[Any] = [(refs, error, files)] if alone else [None] * world
    if not alone:
        dist.all_gather_object(gathered, (refs, error, files), group=group)
    errors = [e for _, e, _ in gathered if e]
    result: list[Any] = [None]
    if not errors and rank == 0:
        try:
            every = [PartRef(**r) for got, _, _ in gathered for r in got]
            result[0] = publish_commit(
                store,
                head,
                plan,
                every,
                options,
                keep_last=keep_last,
                keep_best=keep_best,
                parts_verified=check,
            ).url
        except RestorePointError as exc:
            errors.append(f"commit: {type(exc).__name__}: {exc.message}")
    if rank == 0:
        result[0] = result[0] or {"errors": errors}
    if not alone:
        dist.broadcast_object_list(result, src=0, group=group)
    if files_out is not None:
        for _, _, each in gathered:
            files_out.update(each)
    if isinstance(result[0], dict):
        raise StorageError(
            "no restore point: " + "; ".join(result[0]["errors"] or errors), url=store
        )
    return str(result[0])


def import_dcp(  # noqa: PLR0913 - the one gated import's options, for this rank
    url: str,
    dest: str | os.PathLike[str],
    *,
    views: Sequence[Expectations],
    trust: Trust | None = None,
    storage_options: dict[str, Any] | None = None,
    group: Any = None,
) -> Path:
    """Import, through the gated import, what this rank's ``dcp.load`` needs into ``dest``
    (a directory of this node): the ``.metadata`` and this rank's files on the world that made
    the restore point, every part on another. Returns ``dest``."""
    rank, world = _world(group)
    result = resume_import(
        url,
        dest,
        views=views,
        trust=trust,
        storage_options=storage_options,
        rank=rank,
        world_size=world,
    )
    return Path(result.dest)
