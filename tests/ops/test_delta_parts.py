"""Incremental parts (spec section 28.7): each rank's part of a multi-part restore point
references its own part of the run's newest commit; a commit verifies and imports through its
parts' references; a rank with no previous part publishes a full one; prune keeps the commits
whose parts are bases; fsck reports a part's dangling reference; and a part whose base is
another rank's part, or another run's, is refused by verify and import in one line (exit 1)
before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

from restorepoint import IntegrityError
from restorepoint.format import PartRef, canonical_dumps, read_prefix, read_tail
from restorepoint.format.layout import END_MAGIC, FOOTER
from restorepoint.ops import import_restore_point, list_store, prune, read_manifest, verify
from restorepoint.ops.fsck import fsck
from restorepoint.ops.parts import CommitPlan, publish_commit, publish_part
from restorepoint.ops.publish import HeadSpec, PackOptions, PublishResult
from restorepoint.storage import resolve

MIB = 1 << 20
OPTIONS = PackOptions(incremental=True, chunk_size=MIB, codec="none")


def _sources(root: Path, frozen: dict[int, bytes], step: int) -> Path:
    """Each rank's files: its frozen backbone (4 chunks) and a chunk that changes."""
    for rank, data in frozen.items():
        own = root / f"model.rank{rank}.bin"
        own.parent.mkdir(parents=True, exist_ok=True)
        own.write_bytes(data + os.urandom(MIB))
    (root / "position.json").write_text(json.dumps({"step": step}))
    return root


def _commit(
    src: Path,
    store: str,
    step: int,
    world: int,
    *,
    run: str = "r1",
    rests: dict[int, Any] | None = None,
    **kw: Any,
) -> tuple[PublishResult, list[PartRef]]:
    """A commit of ``world`` ranks (each rank's part published in turn, as each rank would,
    with its own publisher's rest from ``rests``), rank 0's part holding the position."""
    head = HeadSpec(position=step, run=run)
    plan = CommitPlan.new(world)
    refs = [
        publish_part(
            src,
            store,
            head,
            plan,
            rank=rank,
            options=OPTIONS,
            include=[f"model.rank{rank}.bin", *(["position.json"] if rank == 0 else [])],
            rest=(rests or {}).get(rank),
        )
        for rank in range(world)
    ]
    return publish_commit(store, head, plan, refs, OPTIONS, **kw), refs


def _part_url(commit_url: str, ref: PartRef) -> str:
    return f"{commit_url.removesuffix('.rp')}.parts/{ref.name}"


def test_each_rank_references_its_own_part_and_prune_keeps_the_bases(tmp_path: Path) -> None:
    store = f"{tmp_path}/store/"
    frozen = {r: os.urandom(4 * MIB) for r in (0, 1)}
    src = tmp_path / "src"
    commits = []
    for step in (1, 2, 3):
        commits.append(_commit(_sources(src, frozen, step), store, step, 2))
    (first, first_refs), (_, _), (last, last_refs) = commits
    for ref in first_refs:
        assert read_manifest(_part_url(first.url, ref)).bases == ()
    full = {ref.name: ref.size for ref in first_refs}
    for result, refs in commits[1:]:
        for ref in refs:
            part = read_manifest(_part_url(result.url, ref))
            # Flattened: every frame of the frozen backbone lies in the first commit's part
            # of the same rank; only the changed chunk (of 5) is stored.
            assert [b.name for b in part.bases or ()] == [
                f"{first.url.removeprefix(store).removesuffix('.rp')}.parts/{ref.name}"
            ]
            assert ref.size < 0.25 * full[ref.name], (ref.name, ref.size, full[ref.name])
    # The commit verifies through its parts' references, and imports bit for bit.
    report = verify(last.url)
    assert [p.digest for p in report.parts] == [r.digest for r in last_refs]
    dest = tmp_path / "imported"
    import_restore_point(last.url, dest)
    for name in ("model.rank0.bin", "model.rank1.bin", "position.json"):
        assert (dest / name).read_bytes() == (src / name).read_bytes()
    # A rank whose previous part does not exist (the world grew) publishes a full part.
    frozen[2] = os.urandom(4 * MIB)
    grown, grown_refs = _commit(_sources(src, frozen, 4), store, 4, 3)
    bases = {r.name: read_manifest(_part_url(grown.url, r)).bases for r in grown_refs}
    assert bases["rank-00002.rp"] == ()
    assert bases["rank-00000.rp"] and bases["rank-00001.rp"]
    # keep-last 1 keeps the newest and the first commit, whose parts are its parts' bases.
    report_prune = prune(store, keep_last=1)
    kept = {e.step: reasons for run in report_prune.runs for e, reasons in run.keep}
    assert sorted(kept) == [1, 4]
    assert any(r.startswith("base of") for r in kept[1])
    for entry in list_store(store):
        verify(entry.url)
    # A base deleted by hand (the first commit and its parts): a dangling reference, from the
    # parts' indexes alone.
    os.remove(first.url)
    shutil.rmtree(first.url.removesuffix(".rp") + ".parts")
    findings = fsck(store).findings
    assert [(f.kind, f.url) for f in findings] == [("dangling_reference", grown.url)]
    assert ".parts/rank-0000" in findings[0].detail
    # And the commit fails verification with one line naming the base.
    with pytest.raises(IntegrityError, match=r"base r1/\S+\.parts/rank-0000[01]\.rp is missing"):
        verify(grown.url)


def _rewrite(path: str, change: Callable[[dict[str, Any]], None]) -> None:
    """The object's index changed in place (its digest and footer recomputed)."""
    data = Path(path).read_bytes()
    index_offset, index_length, _, _, _ = FOOTER.unpack(data[-FOOTER.size :])
    index = json.loads(data[index_offset : index_offset + index_length])
    change(index)
    new = canonical_dumps(index)
    footer = FOOTER.pack(index_offset, len(new), hashlib.sha256(new).digest(), 0, END_MAGIC)
    Path(path).write_bytes(data[:index_offset] + new + footer)


def _digest(path: str) -> str:
    """The restore point digest of the object at ``path``, from its head and tail alone."""
    from restorepoint.format import restore_point_digest

    reader = resolve(path).reader()
    try:
        prefix = read_prefix(reader)
        tail = read_tail(reader, prefix.data_start)
        return restore_point_digest(
            read_manifest(path, head_only=True).id, prefix.head_sha256, tail.index_sha256
        )
    finally:
        reader.close()


def test_a_part_whose_base_is_another_ranks_or_another_runs_is_refused(tmp_path: Path) -> None:
    store = f"{tmp_path}/store/"
    frozen = {r: os.urandom(4 * MIB) for r in (0, 1)}
    src = tmp_path / "src"

    def other_rank(i: dict[str, Any], rank1: PartRef, name: str, run: str) -> None:
        i["bases"][0].update(name=name, digest=rank1.digest)

    def laid_under_rank_0(i: dict[str, Any], rank1: PartRef, name: str, run: str) -> None:
        # Rank 1's part, copied under a rank 0 name: the name passes, the object does not.
        swapped = f"{run}/{0:016d}-20261201T090000000Z-{1:012x}.parts/rank-00000.rp"
        Path(store, swapped).parent.mkdir(parents=True)
        shutil.copyfile(Path(store, name), Path(store, swapped))
        i["bases"][0].update(name=swapped, digest=rank1.digest)

    def other_run(i: dict[str, Any], rank1: PartRef, name: str, run: str) -> None:
        i["bases"][0]["name"] = "r2/" + i["bases"][0]["name"].split("/", 1)[1]

    cases = [
        (other_rank, "is a part of another rank, not rank-00000.rp"),
        (laid_under_rank_0, "is not a part of this rank"),
        (other_run, "is a restore point of another run"),
    ]
    for n, (change, words) in enumerate(cases):
        run = f"h{n}"
        base, base_refs = _commit(_sources(src, frozen, 1), store, 1, 2, run=run)
        rank1 = base_refs[1]
        rank1_name = _part_url(base.url, rank1).removeprefix(store)
        # A hostile publisher: rank 0's part rewritten, and a commit that names it.
        head = HeadSpec(position=2, run=run)
        plan = CommitPlan.new(2)
        _sources(src, frozen, 2)
        refs = []
        for rank in (0, 1):
            files = [f"model.rank{rank}.bin", *(["position.json"] if rank == 0 else [])]
            ref = publish_part(src, store, head, plan, rank=rank, options=OPTIONS, include=files)
            if rank == 0:
                where = f"{store}{plan.commit_name(head).removesuffix('.rp')}.parts/{ref.name}"
                _rewrite(where, lambda i: change(i, rank1, rank1_name, run))  # noqa: B023
                ref = PartRef(ref.name, 0, ref.id, _digest(where), os.path.getsize(where))
            refs.append(ref)
        commit = publish_commit(store, head, plan, refs, OPTIONS).url
        proc = cli("verify", commit)
        assert proc.returncode == 1, proc.stderr
        assert words in one_error_line(proc)
        dest = tmp_path / f"dest{n}"
        proc = cli("import", commit, str(dest))
        assert proc.returncode == 1, proc.stderr
        assert words in one_error_line(proc)
        assert list(tmp_path.glob(f"*dest{n}*")) == []  # no staging left either


def test_a_part_whose_base_fails_its_check_is_replaced_by_a_full_one(tmp_path: Path) -> None:
    """The rank reads its part back through its references before the part is named (spec
    28.7): a base damaged since the plan read its index makes the part unsound, and a full
    part takes its place under the same name; the commit that names it verifies."""
    store = f"{tmp_path}/store/"
    frozen = {0: os.urandom(4 * MIB)}
    src = _sources(tmp_path / "src", frozen, 1)
    first, (ref,) = _commit(src, store, 1, 1)
    # A byte of the base's frozen backbone flipped: its head and index still check out.
    base = Path(_part_url(first.url, ref))
    data = bytearray(base.read_bytes())
    start = _data_start(str(base))
    data[start + 100] ^= 0xFF
    base.write_bytes(bytes(data))
    head, plan = HeadSpec(position=2, run="r1"), CommitPlan.new(1)
    _sources(src, frozen, 2)
    part = publish_part(
        src, store, head, plan, rank=0, options=OPTIONS, include=None, verify_it=True
    )
    where = f"{store}{plan.commit_name(head).removesuffix('.rp')}.parts/{part.name}"
    # Not even delta/1: the full part of the fallback (a planned full part names "bases": []).
    assert read_manifest(where).bases is None
    commit = publish_commit(store, head, plan, [part], OPTIONS)
    assert verify(commit.url).parts[0].digest == part.digest


def _data_start(path: str) -> int:
    reader = resolve(path).reader()
    try:
        return read_prefix(reader).data_start
    finally:
        reader.close()


def test_each_rank_s_parts_rest_on_their_own(tmp_path: Path) -> None:
    # A rank whose part would reuse too little rests (spec 28.4, 28.7): that part and the
    # rank's next ones name no chunks, while another rank's part, whose frozen backbone is
    # reused, stays incremental; the same rest serves both, counted per rank.
    from restorepoint.format.delta import DELTA_FEATURE
    from restorepoint.ops.publish import Rest

    store = f"{tmp_path}/store/"
    src = tmp_path / "src"
    rests = {0: Rest(2), 1: Rest(2)}  # one per rank's publisher, as each rank keeps its own
    frozen = {1: os.urandom(4 * MIB)}
    features: list[dict[int, tuple[str, ...]]] = []
    for step in range(1, 6):
        src.mkdir(exist_ok=True)
        (src / "model.rank0.bin").write_bytes(os.urandom(5 * MIB))  # all of it changes
        (src / "model.rank1.bin").write_bytes(frozen[1] + os.urandom(MIB))
        (src / "position.json").write_text(json.dumps({"step": step}))
        result, refs = _commit(src, store, step, 2, rests=rests)
        features.append(
            {
                rank: read_manifest(_part_url(result.url, ref)).required_features
                for rank, ref in zip((0, 1), refs, strict=True)
            }
        )
        verify(result.url)
    # Rank 0: its first part names its chunks (nothing to reference yet), the second would
    # reuse nothing and rests with the next two, the fifth names its chunks again.
    assert [DELTA_FEATURE in f[0] for f in features] == [True, False, False, False, True]
    # Rank 1 references its backbone at every commit after the first.
    assert all(DELTA_FEATURE in f[1] for f in features)
    dest = tmp_path / "imported"
    import_restore_point(result.url, dest)
    for name in ("model.rank0.bin", "model.rank1.bin", "position.json"):
        want = hashlib.sha256((src / name).read_bytes()).hexdigest()
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == want, name
