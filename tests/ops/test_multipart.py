"""Multi-part restore points (spec section 25): a part per rank and a commit published last.

Each rank's files are in a directory of their own (two nodes share only the store); the store
is a local directory or moto's S3 server. What is shown: the commit is one restore point to
list, latest, verify and prune; an import takes a rank's parts only; a snapshot whose commit
never landed leaves the previous restore point the newest; a part that is not the one named is
refused; a world size the restore point was not made by is refused unless it reshards.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from restorepoint.errors import IncompatibleRestorePoint, IntegrityError, NotFound, UsageError
from restorepoint.format import MULTIPART_FEATURE, Manifest, PartRef, Parts, Trainer
from restorepoint.ops import HeadSpec, import_restore_point, latest, list_store, prune, verify
from restorepoint.ops.gate import UNSET, Expectations
from restorepoint.ops.parts import CommitPlan, publish_commit, publish_part
from restorepoint.ops.resume import choose
from restorepoint.ops.spec import PackOptions
from restorepoint.storage import resolve
from tests.clirun import cli

RUN = "ddp-run"


def _spec(step: int) -> HeadSpec:
    return HeadSpec(
        position=step,
        trainer=("restorepoint.torch", "1"),
        terms={"torch": "2.13.0"},
        config={"lr": 0.1},
        run=RUN,
    )


def _rank_dirs(tmp: Path, world: int, step: int) -> tuple[list[Path], Path]:
    dirs = []
    for rank in range(world):
        d = tmp / f"node{rank}" / f"step{step}"
        d.mkdir(parents=True)
        (d / f"last.rank{rank}.pt").write_bytes(f"rank {rank} state at {step}".encode() * 50)
        dirs.append(d)
    shared = tmp / "node0" / f"shared{step}"
    shared.mkdir()
    (shared / "shared.pt").write_bytes(os.urandom(200_000))
    return dirs, shared


def _publish(
    store: str, tmp: Path, world: int, step: int, *, reshardable: bool = False, **kw: Any
) -> tuple[str, CommitPlan]:
    options = PackOptions(storage_options=kw.get("storage_options"))
    dirs, shared = _rank_dirs(tmp, world, step)
    plan = CommitPlan.new(world, reshardable=reshardable)
    spec = _spec(step)
    refs = [publish_part(d, store, spec, plan, rank=r, options=options) for r, d in enumerate(dirs)]
    refs.append(publish_part(shared, store, spec, plan, rank=None, options=options))
    result = publish_commit(store, spec, plan, refs, options, keep_last=kw.get("keep_last"))
    return result.url, plan


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    if request.param == "local":
        return str(tmp_path / "store") + "/", None
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/runs/", request.getfixturevalue("s3_storage_options")


def test_one_restore_point_whole_or_by_rank(store: Any, tmp_path: Path) -> None:
    url, opts = store
    commit_url, _ = _publish(url, tmp_path, 2, 10, storage_options=opts)
    entries = list_store(url, storage_options=opts)
    assert [e.url for e in entries] == [commit_url]  # the parts are not restore points
    assert latest(url, storage_options=opts).url == commit_url
    report = verify(commit_url, storage_options=opts)
    assert [p.manifest.part.rank for p in report.parts if p.manifest.part] == [0, 1, None]
    assert report.files == 3
    assert report.manifest.parts is not None
    assert report.manifest.parts.world_size == 2
    assert MULTIPART_FEATURE in report.manifest.required_features

    rank1 = import_restore_point(commit_url, tmp_path / "fresh1", rank=1, storage_options=opts)
    assert sorted(os.listdir(rank1.dest)) == ["last.rank1.pt", "shared.pt"]
    assert (Path(rank1.dest) / "shared.pt").read_bytes() == (
        tmp_path / "node0" / "shared10" / "shared.pt"
    ).read_bytes()
    whole = import_restore_point(commit_url, tmp_path / "whole", storage_options=opts)
    assert sorted(os.listdir(whole.dest)) == ["last.rank0.pt", "last.rank1.pt", "shared.pt"]


def test_a_commit_that_never_landed_leaves_the_previous_newest(store: Any, tmp_path: Path) -> None:
    url, opts = store
    first, _ = _publish(url, tmp_path / "a", 2, 10, storage_options=opts)
    # Step 20: rank 0's part landed, rank 1 was killed before its own: no commit.
    dirs, _ = _rank_dirs(tmp_path / "b", 2, 20)
    plan = CommitPlan.new(2)
    publish_part(dirs[0], url, _spec(20), plan, rank=0, options=PackOptions(storage_options=opts))
    assert latest(url, storage_options=opts, verify_it=True).url == first
    assert [e.url for e in list_store(url, storage_options=opts)] == [first]
    # Within GRACE the orphan part is kept (its commit may still come); after it, removed.
    kept = prune(url, keep_last=1, storage_options=opts)
    assert kept.leftovers == []
    gone = prune(url, keep_last=1, grace=0, storage_options=opts)
    assert len(gone.leftovers) == 1
    assert gone.leftovers[0].endswith("/rank-00000.rp")
    assert latest(url, storage_options=opts, verify_it=True).url == first


def test_prune_removes_a_commit_with_its_parts(store: Any, tmp_path: Path) -> None:
    url, opts = store
    old, _ = _publish(url, tmp_path / "a", 2, 10, storage_options=opts)
    new, _ = _publish(url, tmp_path / "b", 2, 20, storage_options=opts, keep_last=1)
    assert [e.url for e in list_store(url, storage_options=opts)] == [new]
    # Nothing of the old one is left, parts included (no leftover for a later prune).
    report = prune(url, keep_last=1, grace=0, storage_options=opts)
    assert report.deleted == []
    assert report.leftovers == []
    assert resolve(old.removesuffix(".rp") + ".parts/", opts).list_objects() == []
    with pytest.raises(NotFound):
        verify(old, storage_options=opts)


def _swap_part(commit_url: str, tmp: Path, other: str) -> None:
    """Replace rank 1's part of ``commit_url`` (a local store) with that of ``other``."""
    a = Path(commit_url.removesuffix(".rp") + ".parts") / "rank-00001.rp"
    b = Path(other.removesuffix(".rp") + ".parts") / "rank-00001.rp"
    a.write_bytes(b.read_bytes())


@pytest.mark.parametrize("by_ranks", [True, False])
def test_the_prune_after_a_commit_reads_no_part_payload_its_ranks_verified(
    by_ranks: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prune after a multi-rank publish verifies the newest restore point (spec 19.5).
    When every rank read its own part back (publish_part(verify_it=True)), the commit's
    parts are checked up to their payloads only: rank 0 reads no other rank's bytes. Without
    that, the prune streams every part's payload."""
    verify_module = importlib.import_module("restorepoint.ops.verify")
    url = str(tmp_path / "store") + "/"
    _publish(url, tmp_path / "a", 2, 10)
    dirs, shared = _rank_dirs(tmp_path / "b", 2, 20)
    plan, spec = CommitPlan.new(2), _spec(20)
    checked: list[str] = []
    real = verify_module._check_payload

    def recording(reader: Any, head: Any, manifest: Manifest, *a: Any) -> int:
        checked.append("part" if manifest.part is not None else "commit")
        return real(reader, head, manifest, *a)

    monkeypatch.setattr(verify_module, "_check_payload", recording)
    refs = [
        publish_part(d, url, spec, plan, rank=r, verify_it=by_ranks) for r, d in enumerate(dirs)
    ]
    refs.append(publish_part(shared, url, spec, plan, rank=None, verify_it=by_ranks))
    # Each rank's read-back of its own part: one payload check a part, or none.
    assert checked == (["part"] * 3 if by_ranks else [])
    checked.clear()
    result = publish_commit(url, spec, plan, refs, keep_last=1, parts_verified=by_ranks)
    assert result.pruned is not None
    assert len(result.pruned.deleted) == 1
    assert checked == (["commit"] if by_ranks else ["commit", "part", "part", "part"])
    assert [e.url for e in list_store(url)] == [result.url]
    assert verify(result.url).manifest.parts is not None


def test_a_part_that_is_not_the_one_named_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "store") + "/"
    first, _ = _publish(url, tmp_path / "a", 2, 10)
    second, _ = _publish(url, tmp_path / "b", 2, 20)
    _swap_part(second, tmp_path, first)  # a sound part, of another commit
    with pytest.raises(IntegrityError, match="not the one its commit names"):
        verify(second)
    with pytest.raises(IntegrityError, match="not the one its commit names"):
        import_restore_point(second, tmp_path / "dest", rank=1)
    assert not (tmp_path / "dest").exists()
    # latest --verify and prune fall back to the complete one, and keep the broken newest.
    assert latest(url, verify_it=True).url == first
    plan = prune(url, keep_last=1, dry_run=True).runs[0]
    assert plan.verified == first.rsplit("/", 2)[-2] + "/" + first.rsplit("/", 1)[-1]
    proc = cli("verify", second)
    assert proc.returncode == 1
    assert "not the one its commit names" in proc.stderr


def test_a_missing_part_is_no_restore_point(tmp_path: Path) -> None:
    url = str(tmp_path / "store") + "/"
    commit, _ = _publish(url, tmp_path, 2, 10)
    (Path(commit.removesuffix(".rp") + ".parts") / "rank-00000.rp").unlink()
    with pytest.raises(IntegrityError, match="missing"):
        verify(commit)
    with pytest.raises(IntegrityError, match="missing"):
        import_restore_point(commit, tmp_path / "dest", rank=0)
    assert not (tmp_path / "dest").exists()


def test_world_size_gate(tmp_path: Path) -> None:
    url = str(tmp_path / "store") + "/"
    commit, _ = _publish(url, tmp_path / "a", 2, 10)
    with pytest.raises(IncompatibleRestorePoint, match="made by 2"):
        import_restore_point(commit, tmp_path / "d4", rank=0, world_size=4)
    assert not (tmp_path / "d4").exists()
    proc = cli("import", commit, str(tmp_path / "d4"), "--rank", "0", "--world-size", "4")
    assert proc.returncode == 3, proc.stderr
    assert "not declared reshardable" in proc.stderr
    assert "Traceback" not in proc.stderr
    # A reshardable state resumes on another world: every rank takes every part.
    other = tmp_path / "b"
    reshard, _ = _publish(str(tmp_path / "store2") + "/", other, 2, 10, reshardable=True)
    got = import_restore_point(reshard, tmp_path / "d1", rank=0, world_size=1)
    assert sorted(os.listdir(got.dest)) == ["last.rank0.pt", "last.rank1.pt", "shared.pt"]
    with pytest.raises(UsageError):
        import_restore_point(commit, tmp_path / "d5", rank=5)


def test_the_gate_chooses_by_world_size(tmp_path: Path) -> None:
    """choose() compares the world size like any other field: the newest restore point, made
    by 2 ranks, is refused to 4, naming the older one that 4 ranks made; accept_older takes
    it. A view that names no world compares none."""
    url = str(tmp_path / "store") + "/"
    four, _ = _publish(url, tmp_path / "a", 4, 10)
    two, _ = _publish(url, tmp_path / "b", 2, 20)
    view = Expectations(
        trainer=Trainer("restorepoint.torch", "1"),
        terms={"torch": "2.13.0"},
        config={"lr": 0.1},
        world_size=4,
        sources={"world_size": "torch.distributed"},
    )
    with pytest.raises(IncompatibleRestorePoint) as refused:
        choose(url, run=RUN, views=[view])
    assert refused.value.mismatches == [
        {"expected": 4, "field": "world_size", "found": 2, "source": "torch.distributed"}
    ]
    details = "\n".join(refused.value.details)
    assert "world_size: here 4 (torch.distributed), in the restore point 2" in details
    assert "not declared reshardable" in details
    assert "step 10" in details  # the older one that would pass
    chosen = choose(url, run=RUN, views=[view], accept_older=True)
    assert chosen is not None
    assert chosen.url == four
    assert choose(url, run=RUN, views=[replace(view, world_size=2)]).url == two  # type: ignore[union-attr]
    assert choose(url, run=RUN, views=[replace(view, world_size=UNSET)]).url == two  # type: ignore[union-attr]
    # One process (world 1) is refused a 2-rank restore point, and takes a 1-process one.
    with pytest.raises(IncompatibleRestorePoint, match="world_size"):
        choose(url, run=RUN, views=[replace(view, world_size=1)])


def test_a_part_alone_is_not_imported(tmp_path: Path) -> None:
    url = str(tmp_path / "store") + "/"
    commit, _ = _publish(url, tmp_path, 2, 10)
    part = commit.removesuffix(".rp") + ".parts/rank-00000.rp"
    assert verify(part).manifest.part is not None  # a sound object
    with pytest.raises(IncompatibleRestorePoint, match="one part"):
        import_restore_point(part, tmp_path / "dest")
    proc = cli("import", part, str(tmp_path / "dest"))
    assert proc.returncode == 3
    assert not (tmp_path / "dest").exists()


def test_cli_list_latest_verify_prune(tmp_path: Path) -> None:
    url = str(tmp_path / "store") + "/"
    old, _ = _publish(url, tmp_path / "a", 2, 10)
    new, _ = _publish(url, tmp_path / "b", 2, 20)
    listed = json.loads(cli("list", url, "--json").stdout)
    assert [e["url"] for e in listed["restore_points"]] == [new, old]
    assert cli("latest", url, "--verify").stdout.strip() == new
    verified = json.loads(cli("verify", new, "--json").stdout)
    assert [p["rank"] for p in verified["parts"]] == [0, 1, None]
    assert verified["files"] == 3
    proc = cli("prune", url, "--keep-last", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["deleted"] == [old]
    assert not Path(old.removesuffix(".rp") + ".parts").exists() or not os.listdir(
        old.removesuffix(".rp") + ".parts"
    )
    proc = cli("import", "--latest", url, str(tmp_path / "r1"), "--rank", "1")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "r1")) == ["last.rank1.pt", "shared.pt"]


def test_format_version_and_head(tmp_path: Path) -> None:
    url = str(tmp_path / "store") + "/"
    commit, plan = _publish(url, tmp_path, 2, 10)
    data = Path(commit).read_bytes()
    assert struct.unpack("<HH", data[8:12]) == (1, 1)
    head = verify(commit).manifest
    assert head.format_version == "1.1"
    assert head.id == plan.id
    assert head.payload == ()
    assert head.parts is not None
    assert [r.name for r in head.parts.objects] == ["rank-00000.rp", "rank-00001.rp", "shared.rp"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p["objects"].pop(0), "exactly one part for every rank"),
        (lambda p: p.update(world_size=0), "world_size"),
        (lambda p: p["objects"][0].update(name="rank-00007.rp"), "is named"),
        (lambda p: p["objects"].reverse(), "sorted"),
        (lambda p: p.update(reshardable="yes"), "reshardable"),
        (lambda p: p["objects"][1].update(id="b" * 32), "the same id"),
    ],
)
def test_parts_member_is_checked(mutate: Any, message: str) -> None:
    ref = {"digest": "a" * 64, "id": "b" * 32, "size": 100}
    parts = {
        "objects": [
            {**ref, "name": "rank-00000.rp", "rank": 0},
            {**ref, "id": "c" * 32, "name": "rank-00001.rp", "rank": 1},
        ],
        "reshardable": False,
        "world_size": 2,
    }
    assert Parts.from_dict(json.loads(json.dumps(parts))).world_size == 2
    mutate(parts)
    with pytest.raises(IntegrityError, match=message):
        Parts.from_dict(parts)


def test_parts_without_the_feature_are_refused(tmp_path: Path) -> None:
    commit, _ = _publish(str(tmp_path / "s") + "/", tmp_path, 1, 1)
    head = verify(commit).manifest.head_dict()
    assert Manifest.from_head_dict(head).parts is not None
    head["required_features"] = []
    with pytest.raises(IntegrityError, match="go with the required feature"):
        Manifest.from_head_dict(head)
    assert PartRef.name_for(3) == "rank-00003.rp"


def test_commit_and_part_manifests_match_the_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).parents[2] / "spec" / "manifest.schema.json").read_text())
    commit, _ = _publish(str(tmp_path / "s") + "/", tmp_path, 2, 10)
    report = verify(commit)
    for manifest in [report.manifest, *(p.manifest for p in report.parts)]:
        jsonschema.validate(manifest.to_dict(), schema)
