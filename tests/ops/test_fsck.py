"""fsck (spec 19.8): a store seeded with one of each defect, locally and on S3; each is found
and named; --repair removes only what prune removes; the report as data."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from restorepoint.ops import entry_name
from restorepoint.ops.fsck import KINDS, FsckReport, fsck
from restorepoint.ops.parts import CommitPlan, publish_commit, publish_part
from restorepoint.ops.spec import HeadSpec, PackOptions
from restorepoint.ops.store import DEFAULT_GRACE_S, prune
from tests.clirun import cli, one_error_line
from tests.ops.test_store import DEAD_PID, corrupt, partial, publish, put

OLD = 2 * DEFAULT_GRACE_S
ORPHAN_STEM = "m/0000000000000009-20260101T000000000Z-0123456789ab"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(3000))
    (src / "state.json").write_text('{"step": 1}')
    return src


def commit_with_parts(store: str, tmp: Path, opts: dict[str, Any] | None = None) -> str:
    """A two-rank restore point of run m at step 5; returns its store name."""
    spec = HeadSpec(position=5, trainer=("t", "1"), run="m")
    plan = CommitPlan.new(2)
    options = PackOptions(storage_options=opts)
    refs = []
    for rank in range(2):
        d = tmp / f"rank{rank}"
        d.mkdir()
        (d / f"state.rank{rank}.pt").write_bytes(os.urandom(500))
        refs.append(publish_part(d, store, spec, plan, rank=rank, options=options))
    publish_commit(store, spec, plan, refs, options)
    return plan.commit_name(spec)


def by_kind(report: FsckReport, *, pending: bool = False) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {k: [] for k in KINDS}
    for f in report.findings:
        if f.pending == pending:
            out[f.kind].append(f.name)
    return out


def seed_local(store: Path, source: Path, tmp: Path) -> dict[str, str]:
    """One of each defect a local store can hold; returns their names."""
    now = time.time()
    good = publish(source, store, "a", 1)
    flipped = publish(source, store, "a", 2, at=1)
    corrupt(Path(flipped.url))
    truncated = publish(source, store, "a", 3, at=2)
    data = Path(truncated.url).read_bytes()
    Path(truncated.url).write_bytes(data[: len(data) // 2])
    commit = commit_with_parts(f"{store}/", tmp)
    missing = f"{commit.removesuffix('.rp')}.parts/rank-00001.rp"
    (store / missing).unlink()
    orphan = f"{ORPHAN_STEM}.parts/rank-00000.rp"
    put(store / orphan, now - OLD)
    stray = "a/notes.txt"
    put(store / stray, now - OLD)
    leftover = f"a/{partial('x.rp', DEAD_PID)}"
    put(store / leftover, now - OLD)
    young = f"a/{partial('y.rp', DEAD_PID)}"
    put(store / young, now - 60)
    return {
        "good": good.url,
        "flipped": entry_name(flipped.manifest),
        "truncated": entry_name(truncated.manifest),
        "commit": commit,
        "orphan": orphan,
        "stray": stray,
        "leftover": leftover,
        "young": young,
    }


def test_every_defect_is_found_and_repair_removes_only_what_prune_would(
    store: Path, source: Path, tmp_path: Path
) -> None:
    seeded = seed_local(store, source, tmp_path)
    report = fsck(str(store))
    found = by_kind(report)
    assert found == {
        "damaged": [seeded["truncated"]],  # the flipped byte is in the payload: not read
        "missing_part": [seeded["commit"]],
        "dangling_reference": [],
        "orphan_part": [seeded["orphan"]],
        "leftover": [seeded["leftover"]],
        "upload": [],
        "stray": [seeded["stray"]],
    }
    assert by_kind(report, pending=True)["leftover"] == [seeded["young"]]
    assert (report.restore_points, report.sound) == (4, 2)
    assert not report.clean and report.repaired is None
    (missing,) = [f for f in report.findings if f.kind == "missing_part"]
    assert "rank-00001" in missing.detail and missing.error == "IntegrityError"
    (damaged,) = [f for f in report.findings if f.kind == "damaged"]
    assert damaged.error == "TruncatedRestorePoint"
    removable = sorted(f.url for f in report.findings if f.removable)
    assert removable == sorted([f"{store}/{seeded['orphan']}", f"{store}/{seeded['leftover']}"])
    # What prune's own cleanup would take is exactly what fsck calls removable.
    assert sorted(prune(str(store), keep_last=100, dry_run=True).leftovers) == removable

    read = by_kind(fsck(str(store), read_data=True))
    assert read["damaged"] == sorted([seeded["flipped"], seeded["truncated"]])
    (flip,) = [f for f in fsck(str(store), read_data=True).findings if f.name == seeded["flipped"]]
    assert flip.error == "DigestMismatch" and not flip.removable

    repaired = fsck(str(store), read_data=True, repair=True)
    assert sorted(repaired.repaired or []) == removable
    assert not (store / seeded["orphan"]).exists() and not (store / seeded["leftover"]).exists()
    assert (store / seeded["young"]).exists() and (store / seeded["stray"]).exists()
    assert (store / seeded["flipped"]).exists() and (store / seeded["truncated"]).exists()
    # What it must not remove is still a defect; the rest is gone.
    assert sorted(f.name for f in repaired.defects) == sorted(
        [seeded["flipped"], seeded["truncated"], seeded["commit"], seeded["stray"]]
    )
    after = fsck(str(store), read_data=True)
    assert by_kind(after)["orphan_part"] == [] and by_kind(after)["leftover"] == []
    assert sorted(f.name for f in after.defects) == sorted(f.name for f in repaired.defects)


def test_a_clean_store_and_an_empty_one(store: Path, source: Path, tmp_path: Path) -> None:
    publish(source, store, "a", 1)
    commit_with_parts(f"{store}/", tmp_path)
    report = fsck(str(store), read_data=True)
    assert (
        report.clean and report.findings == [] and (report.restore_points, report.sound) == (2, 2)
    )
    assert report.objects == 4  # a, the commit and its two parts
    empty = fsck(str(tmp_path / "nothing"))
    assert empty.clean and empty.objects == 0


def test_a_live_runs_resume_marker_is_neither_a_stray_nor_repaired(
    store: Path, source: Path
) -> None:
    """A resume marker (spec 19.9) beside a run's restore points is the store's own: fsck
    does not call it a stray, and --repair leaves it where prune reads it."""
    from restorepoint.ops.resumed import ResumeMarker
    from restorepoint.storage import resolve

    older = publish(source, store, "a", 1)
    publish(source, store, "a", 2, at=60)
    marker = ResumeMarker(resolve(f"{store}/"), entry_name(older.manifest))
    marker.renew()
    report = fsck(str(store), repair=True)
    assert report.clean and report.findings == [] and report.repaired == [], report.findings
    assert report.objects == 3
    assert Path(marker.url).exists()


def test_a_part_its_commit_does_not_name_is_reported_never_removed(
    store: Path, source: Path, tmp_path: Path
) -> None:
    commit = commit_with_parts(f"{store}/", tmp_path)
    extra = f"{commit.removesuffix('.rp')}.parts/rank-00007.rp"
    put(store / extra, time.time() - OLD)
    report = fsck(str(store), repair=True)
    (finding,) = report.findings
    assert (finding.kind, finding.name, finding.removable) == ("orphan_part", extra, False)
    assert report.repaired == [] and (store / extra).exists() and not report.clean


def test_an_encrypted_restore_point_needs_the_identity_only_for_its_payload(
    store: Path, source: Path, tmp_path: Path
) -> None:
    from restorepoint import Trust, trust

    trust.generate(tmp_path / "id.key", "encryption")
    recipient = trust.load_public(tmp_path / "id.key.pub", "encryption")
    publish(source, store, "r", 1, encrypt_to=[recipient])
    assert fsck(str(store)).clean  # head and index are in the clear
    (finding,) = fsck(str(store), read_data=True).findings
    assert (finding.kind, finding.error) == ("damaged", "DecryptionError")
    policy = Trust(identity=trust.load_identity(tmp_path / "id.key"))
    assert fsck(str(store), read_data=True, trust=policy).clean


@pytest.mark.s3
def test_a_store_on_s3(
    source: Path,
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_client: Any,
    s3_env: dict[str, str],
) -> None:
    url = f"s3://{s3_bucket}/store/"
    opts = s3_storage_options
    publish(source, url, "a", 1, storage_options=opts)
    commit = commit_with_parts(url, tmp_path, opts)
    s3_client.delete_object(
        Bucket=s3_bucket, Key=f"store/{commit.removesuffix('.rp')}.parts/rank-00000.rp"
    )
    s3_client.put_object(
        Bucket=s3_bucket, Key=f"store/{ORPHAN_STEM}.parts/rank-00000.rp", Body=b"x"
    )
    s3_client.put_object(Bucket=s3_bucket, Key="store/a/notes.txt", Body=b"x")
    upload = s3_client.create_multipart_upload(Bucket=s3_bucket, Key="store/a/interrupted.rp")
    (listed,) = s3_client.list_multipart_uploads(Bucket=s3_bucket)["Uploads"]
    # moto reports one fixed Initiated time for every upload, maybe long past.
    initiated = listed["Initiated"].timestamp()
    later = max(time.time(), initiated) + OLD

    report = fsck(url, storage_options=opts, now=later)
    found = by_kind(report)
    assert found["missing_part"] == [commit]
    assert found["orphan_part"] == [f"{ORPHAN_STEM}.parts/rank-00000.rp"]
    assert found["stray"] == ["a/notes.txt"]
    (up,) = [f for f in report.findings if f.kind == "upload"]
    assert up.name == "a/interrupted.rp" and upload["UploadId"] in up.cleanup_name and up.removable
    young = fsck(url, storage_options=opts, now=initiated + 60)
    assert [f.removable for f in young.findings if f.kind == "upload"] == [False]
    assert [f.pending for f in young.findings if f.kind == "upload"] == [True]

    # The CLI on the same store: exit 1, each defect counted; with --grace 0s all are past it.
    proc = cli("fsck", url, "--grace", "0s", "--json", env=s3_env)
    assert proc.returncode == 1, proc.stderr
    counts = json.loads(proc.stdout)["counts"]
    assert counts == {
        "damaged": 0,
        "missing_part": 1,
        "dangling_reference": 0,
        "orphan_part": 1,
        "leftover": 0,
        "upload": 1,
        "stray": 1,
    }

    repaired = fsck(url, storage_options=opts, now=later, repair=True)
    assert len(repaired.repaired or []) == 2
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    after = fsck(url, storage_options=opts, now=later)
    assert sorted(f.kind for f in after.findings) == ["missing_part", "stray"]
    proc = cli("fsck", url, "--repair", "--grace", "0s", env=s3_env)
    assert proc.returncode == 1 and "repaired" in proc.stdout
    assert one_error_line(proc).endswith(f"the store holds 2 defects: {url}")


def _marker_store(root: Path, runs: int, per_run: int, source: Path) -> int:
    """A store of ``runs`` runs: a few real restore points, and (what fills it cheaply) each
    run's resume markers, which fsck lists and classifies but never reads. The object count."""
    for run in range(runs):
        d = root / f"run{run:05d}"
        d.mkdir(parents=True)
        for i in range(per_run):
            (d / f".resumed-{run:016x}{i:016x}.json").write_bytes(b"{}")
    for run in range(3):
        publish(source, f"{root}/", f"run{run:05d}", step=1)
    return runs * per_run + 3


def test_fsck_memory_follows_the_largest_run_not_the_store(source: Path, tmp_path: Path) -> None:
    """A store of 10,000 objects in 100 runs: fsck's peak traced memory stays under 1 MiB
    (the whole listing held at once peaked at 4.2 MiB), and a store ten times smaller peaks
    about the same: the listing streams a run at a time. By hand, 10k and 100k objects:
    docs/reliability.md."""
    import tracemalloc

    peaks = {}
    for runs in (10, 100):
        root = tmp_path / f"store{runs}"
        objects = _marker_store(root, runs, 100, source)
        tracemalloc.start()
        try:
            report = fsck(f"{root}/")
            peaks[objects] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert report.clean, report.to_dict()
        assert report.objects == objects
        assert report.sound == 3
    small, large = sorted(peaks)
    assert peaks[large] < 1 << 20, peaks
    # Ten times the objects, not ten times the memory (a generous margin for noise).
    assert peaks[large] < 2 * peaks[small], peaks
