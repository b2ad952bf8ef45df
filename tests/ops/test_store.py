"""Stores: names, listing, latest, prune (rules, protections, order, leftovers), on local disk
and on S3."""

from __future__ import annotations

import os
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import AlreadyExists, NotFound, UsageError, config_identity
from restorepoint.format import read_head
from restorepoint.ops import entry_name
from restorepoint.ops._naming import NAME_PATTERN
from restorepoint.ops.publish import HeadSpec, PackOptions
from restorepoint.ops.publish import publish as publish_ops
from restorepoint.ops.store import (
    DEFAULT_GRACE_S,
    latest,
    list_store,
    parse_duration,
    prune,
)
from restorepoint.storage import LocalLocation, resolve

CHUNK = 65536
#: Every restore point here is created at a time relative to this one, so that names (and
#: keep-within) are reproducible.
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: No process has this PID (Linux PIDs stay below 2**22): a leftover of a writer long gone.
DEAD_PID = 99_999_999


def when(seconds: float) -> str:
    t = EPOCH + timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(3000))
    (src / "state.json").write_text('{"step": 1}')
    return src


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def publish(
    source: Path, store: Path | str, run: str, step: int, at: float = 0.0, **options: Any
) -> restorepoint.PackResult:
    """A full restore point of ``run`` at ``step``, created ``at`` seconds after EPOCH (the
    rules over full ones; over incremental ones, which keep their bases: test_delta.py)."""
    options.setdefault("incremental", False)
    options.setdefault("chunk_size", CHUNK)
    options.setdefault("threads", 1)
    options.setdefault("level", 0)
    dest = store if not isinstance(store, (str, Path)) else f"{str(store).rstrip('/')}/"
    return restorepoint.pack(source, dest, position=step, run=run, created=when(at), **options)


def corrupt(path: Path) -> None:
    """Flip one payload byte: the head still reads, verification fails."""
    location = resolve(str(path))
    reader = location.reader()
    try:
        offset = read_head(reader).data_start + 4  # past the first frame's length
    finally:
        reader.close()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def names(entries: list[restorepoint.StoreEntry]) -> list[str]:
    return [e.name for e in entries]


def store_files(store: Path) -> set[str]:
    """Every file under the store, hidden ones included, relative to it."""
    return {p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()}


def name_of(result: restorepoint.PackResult) -> str:
    return entry_name(result.manifest)


def partial(final: str, pid: int, suffix: str = "0123456789ab") -> str:
    """The temporary name a local publisher gives ``final`` (restorepoint/storage)."""
    return f".{final}.rp-partial-{pid}-{suffix}"


# -- naming ----------------------------------------------------------------------------------


def test_entry_name_is_run_step_created_id(source: Path, store: Path) -> None:
    rp_id = "0123456789abcdef0123456789abcdef"
    result = restorepoint.pack(
        source, f"{store}/", position=42, run="exp-1.a_b", chunk_size=CHUNK,
        created="2026-01-02T03:04:05.678Z", rp_id=rp_id,
    )  # fmt: skip
    name = "exp-1.a_b/0000000000000042-20260102T030405678Z-0123456789ab.rp"
    assert entry_name(result.manifest) == name
    assert result.url == f"{store}/{name}"
    assert store_files(store) == {name}
    assert NAME_PATTERN.match(name.split("/")[1])
    restorepoint.verify(result.url)
    (entry,) = list_store(str(store))
    assert (entry.run, entry.step, entry.created, entry.id_prefix) == (
        "exp-1.a_b", 42, "20260102T030405678Z", "0123456789ab",
    )  # fmt: skip
    assert entry.to_dict()["created"] == "2026-01-02T03:04:05.678Z"
    assert entry.size == (store / name).stat().st_size


def test_names_sort_by_run_then_step_then_time(source: Path, store: Path) -> None:
    made = [
        publish(source, store, "a", 10, at=0),
        publish(source, store, "a", 9, at=500),  # later, but an earlier step
        publish(source, store, "a", 10, at=50),
        publish(source, store, "a", 100, at=1),
        publish(source, store, "a", 2**53 - 1, at=2),
        publish(source, store, "b", 1, at=0),
    ]
    by_model = sorted(
        made, key=lambda r: (r.manifest.run, r.manifest.position.step, r.manifest.created)
    )
    assert sorted(name_of(r) for r in made) == [name_of(r) for r in by_model]
    top = name_of(made[4]).split("/")[1]
    assert top.startswith(f"{2**53 - 1:016d}-") and NAME_PATTERN.match(top)
    newest_first = [name_of(made[i]) for i in (4, 3, 2, 0, 1)]
    assert names(list_store(str(store), run="a")) == newest_first
    assert latest(str(store), run="a").step == 2**53 - 1


@pytest.mark.parametrize("run", ["", "-lead", ".hidden", "a/b", "a b", "x" * 65, "ü", "a\n"])
def test_a_run_id_that_is_invalid_is_a_usage_error(source: Path, store: Path, run: str) -> None:
    with pytest.raises(UsageError):
        publish(source, store, run, 1)
    assert not store.exists()
    with pytest.raises(UsageError):
        list_store(str(store), run=run)
    with pytest.raises(UsageError):
        latest(str(store), run=run)


def test_a_run_filter_with_a_trailing_newline_is_refused(source: Path, store: Path) -> None:
    publish(source, store, "a", 1)
    with pytest.raises(UsageError):
        list_store(str(store), run="a\n")


def test_pack_into_a_store_needs_a_run(source: Path, store: Path) -> None:
    with pytest.raises(UsageError, match="run"):
        restorepoint.pack(source, f"{store}/", position=1, chunk_size=CHUNK)
    assert not store.exists()
    loc = resolve(str(store))
    with pytest.raises(UsageError, match="run"):
        restorepoint.pack(source, loc, position=1, chunk_size=CHUNK, into_store=True)
    assert not store.exists()


def test_a_config_derives_the_run(source: Path, store: Path) -> None:
    config = {"lr": 0.001, "model": {"width": 64}}
    result = restorepoint.pack(source, f"{store}/", position=3, config=config, chunk_size=CHUNK)
    run = f"cfg-{config_identity(config)[:16]}"
    assert result.manifest.run == run
    assert [e.run for e in list_store(str(store))] == [run]
    assert latest(str(store)).url == result.url
    # The same config with another operational key is another identity: another run.
    other = restorepoint.pack(
        source, f"{store}/", position=4, config=config, operational_keys=["lr"], chunk_size=CHUNK
    )
    assert other.manifest.run == f"cfg-{config_identity(config, ['lr'])[:16]}" != run


def test_into_store_with_a_location(source: Path, store: Path) -> None:
    location = resolve(f"{store}/")
    result = restorepoint.pack(
        source, location, position=5, run="r", chunk_size=CHUNK, into_store=True
    )
    assert result.url == location.join(name_of(result)).url
    assert names(list_store(location)) == [name_of(result)]
    # into_store=False with a store-like DEST is a plain object at that URL.
    plain = restorepoint.pack(
        source, f"{store}/plain.rp", position=5, chunk_size=CHUNK, into_store=False
    )
    assert plain.url == f"{store}/plain.rp"
    assert names(list_store(str(store))) == [name_of(result)]


def test_a_store_publish_is_create_only(source: Path, store: Path) -> None:
    rp_id = "ab" * 16
    first = publish(source, store, "a", 1, rp_id=rp_id)
    before = Path(first.url).read_bytes()
    with pytest.raises(AlreadyExists):
        publish(source, store, "a", 1, rp_id=rp_id, level=3)
    assert Path(first.url).read_bytes() == before
    assert store_files(store) == {name_of(first)}


def test_publish_into_store_prunes_only_after_the_publish(source: Path, store: Path) -> None:
    old = [publish(source, store, "a", s, at=s) for s in (1, 2)]
    other = publish(source, store, "b", 1)
    done = publish_ops(
        source, str(store) + "/", HeadSpec(3, run="a"), PackOptions(chunk_size=CHUNK), keep_last=1
    )
    result, report = done.pack, done.pruned
    assert report is not None
    assert report.deleted == [r.url for r in old]
    assert names(list_store(str(store))) == [name_of(result), name_of(other)]


# -- list ------------------------------------------------------------------------------------


def test_list_is_newest_first_per_run(source: Path, store: Path) -> None:
    made = [publish(source, store, run, s, at=s) for run in ("a", "b", "c") for s in (3, 1, 2)]
    entries = list_store(str(store))
    assert len(entries) == 9
    runs = [e.run for e in entries]
    # Each run's entries are together, newest first.
    groups = [r for i, r in enumerate(runs) if i == 0 or runs[i - 1] != r]
    assert sorted(groups) == ["a", "b", "c"]
    for run in ("a", "b", "c"):
        assert [e.step for e in entries if e.run == run] == [3, 2, 1]
    assert {e.url for e in entries} == {r.url for r in made}
    assert all(Path(e.url).stat().st_size == e.size for e in entries)


def test_list_ignores_everything_that_is_not_a_restore_point(source: Path, store: Path) -> None:
    made = [publish(source, store, run, s) for run, s in (("a", 1), ("a", 2), ("b", 1))]
    good = name_of(made[0]).split("/")[1]
    garbage = [
        f"a/{partial(good, DEAD_PID)}",  # an interrupted publish
        f"a/{partial(good, os.getpid())}",
        "a/notes.txt",
        "README",
        good,  # a restore point name with no run
        f"a/sub/{good}",  # deeper than RUN/NAME
        f"a/sub/deeper/{good}",
        f"-x/{good}",  # not a run id
        f".hidden/{good}",
        f"a/{good}.tmp",
        f"a/{good[:-3]}.rpt",
        f"a/{good[1:]}",  # 15 digits of step
        "a/0000000000000009-20260101T000000000Z-ABCDEF123456.rp",  # upper-case id
        "a/0000000000000009-20260101T000000000Z-abcdef12345.rp",  # 11 hex digits
        "a/0000000000000009-20261399T999999999Z-abcdefabcdef.rp",  # month 13, hour 99
        "a/0000000000000009-20260101T000000000Z-abcdefabcdef.rp\n",
        "a\n/0000000000000009-20260101T000000000Z-abcdefabcdef.rp",
        "a/0000000000000009-20260101T000000000-abcdefabcdef.rp",
    ]
    for rel in garbage:
        path = store / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made[1].url, path)  # even a sound restore point
    (store / "a" / "emptydir.rp").mkdir()
    assert sorted(names(list_store(str(store)))) == sorted(name_of(r) for r in made)
    assert len(store_files(store)) == len(made) + len(garbage)
    assert latest(str(store), run="a").url == made[1].url
    assert [e.to_dict()["created"] for e in list_store(str(store))]  # every stamp is a time


def test_a_missing_store_lists_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert list_store(str(missing)) == []
    assert list_store(f"{missing}/", run="a") == []
    with pytest.raises(NotFound):
        latest(str(missing))
    with pytest.raises(NotFound, match="run a"):
        latest(str(missing), run="a")
    assert not missing.exists()


def test_list_with_a_run_filter(source: Path, store: Path) -> None:
    a = [publish(source, store, "a", s) for s in (1, 2)]
    publish(source, store, "b", 5)
    assert names(list_store(str(store), run="a")) == [name_of(a[1]), name_of(a[0])]
    assert list_store(str(store), run="c") == []
    assert all(e.run == "b" for e in list_store(str(store), run="b"))


# -- latest ----------------------------------------------------------------------------------


def test_latest_of_a_single_run(source: Path, store: Path) -> None:
    made = [publish(source, store, "a", s, at=s) for s in (5, 7, 6)]
    entry = latest(str(store))
    assert entry.url == made[1].url and entry.step == 7
    assert latest(str(store), verify_it=True).url == made[1].url
    assert latest(str(store)).url == latest(f"{store}/").url


def test_several_runs_without_run_is_a_usage_error(source: Path, store: Path) -> None:
    publish(source, store, "alpha", 1)
    beta = publish(source, store, "beta", 2)
    with pytest.raises(UsageError) as info:
        latest(str(store))
    assert "alpha" in str(info.value) and "beta" in str(info.value)
    assert "--run" in str(info.value)
    with pytest.raises(UsageError):
        latest(str(store), verify_it=True)
    assert latest(str(store), run="beta").url == beta.url


def test_verify_skips_a_corrupted_newest(source: Path, store: Path) -> None:
    older = publish(source, store, "a", 1)
    newest = publish(source, store, "a", 2)
    corrupt(Path(newest.url))
    with pytest.raises(restorepoint.DigestMismatch):
        restorepoint.verify(newest.url)
    # The head still says what the name says: without verification it is the newest.
    assert latest(str(store)).url == newest.url
    assert latest(str(store), verify_it=True).url == older.url
    corrupt(Path(older.url))
    with pytest.raises(NotFound, match="verifies"):
        latest(str(store), verify_it=True)


def test_a_head_that_disagrees_with_its_name_is_skipped(source: Path, store: Path) -> None:
    b = publish(source, store, "b", 1)
    a = publish(source, store, "a", 2)
    # a's object copied under a name of run b, newer than b's own restore point.
    forged = store / "b" / name_of(a).split("/")[1]
    shutil.copyfile(a.url, forged)
    assert names(list_store(str(store), run="b"))[0] == f"b/{forged.name}"
    assert latest(str(store), run="b").url == b.url
    assert latest(str(store), run="b", verify_it=True).url == b.url
    # A copy under the right run but another step is not that step's restore point either.
    step = store / "a" / name_of(a).split("/")[1].replace("0000000000000002-", "0000000000000003-")
    shutil.copyfile(a.url, step)
    assert latest(str(store), run="a").url == a.url
    Path(b.url).unlink()
    with pytest.raises(NotFound):
        latest(str(store), run="b")


def test_latest_of_an_empty_store(store: Path) -> None:
    store.mkdir()
    (store / "a").mkdir()
    (store / "a" / "notes.txt").write_text("not a restore point")
    with pytest.raises(NotFound):
        latest(str(store))
    with pytest.raises(NotFound):
        latest(str(store), run="a", verify_it=True)


# -- prune: rules ----------------------------------------------------------------------------


@pytest.fixture
def ten(source: Path, store: Path) -> list[restorepoint.PackResult]:
    """Run r at steps 0..9, one an hour."""
    return [publish(source, store, "r", s, at=s * 3600) for s in range(10)]


def kept_steps(store: Path, run: str = "r") -> set[int]:
    return {e.step for e in list_store(str(store), run=run)}


@pytest.mark.parametrize(
    ("rules", "kept"),
    [
        ({"keep_last": 3}, {9, 8, 7}),
        ({"keep_last": 1}, {9}),
        ({"keep_last": 20}, set(range(10))),
        ({"keep_every": 4}, {9, 7, 3}),  # the newest of 0-3, 4-7, 8-9
        ({"keep_every": 1}, set(range(10))),
        ({"keep_every": 100}, {9}),
        ({"keep_within": "5h"}, {9, 8, 7, 6, 5, 4}),  # 9h - 4h is within 5h
        ({"keep_within": "4h59m"}, {9, 8, 7, 6, 5}),
        ({"keep_within": 0.0}, {9}),
        ({"keep_last": 2, "keep_every": 5}, {9, 8, 4}),
        ({"keep_last": 1, "keep_within": "2h"}, {9, 8, 7}),
        ({"keep_every": 3, "keep_within": "1h"}, {9, 8, 5, 2}),
    ],
)
def test_retention_rules(
    store: Path, ten: list[restorepoint.PackResult], rules: dict[str, Any], kept: set[int]
) -> None:
    report = prune(str(store), **rules)
    assert kept_steps(store) == kept
    (plan,) = report.runs
    assert {e.step for e, _ in plan.keep} == kept
    assert {e.step for e in plan.delete} == set(range(10)) - kept
    assert report.deleted == [ten[s].url for s in sorted(set(range(10)) - kept)]
    assert plan.verified == name_of(ten[9]) and plan.unverified == []


def test_the_plan_records_each_reason(store: Path, ten: list[restorepoint.PackResult]) -> None:
    report = prune(str(store), keep_last=2, keep_every=5, keep_within="30m")
    reasons = {e.step: r for e, r in report.runs[0].keep}
    assert reasons == {
        9: ["newest", "newest that verifies", "keep-last 2", "keep-every 5", "keep-within"],
        8: ["keep-last 2"],
        4: ["keep-every 5"],
    }
    data = report.to_dict()
    assert data["ok"] is True and data["dry_run"] is False and data["store"] == f"{store}/"
    (run,) = data["runs"]
    assert run["run"] == "r" and run["newest_verified"] == name_of(ten[9])
    assert [k["reasons"] for k in run["keep"]] == [reasons[9], reasons[8], reasons[4]]
    assert [d["step"] for d in run["delete"]] == [0, 1, 2, 3, 5, 6, 7]
    assert data["deleted"] == [ten[s].url for s in (0, 1, 2, 3, 5, 6, 7)]


def test_a_dry_run_deletes_nothing_and_reports_the_same_plan(
    store: Path, ten: list[restorepoint.PackResult]
) -> None:
    before = store_files(store)
    dry = prune(str(store), keep_last=2, keep_every=4, dry_run=True)
    assert store_files(store) == before
    assert dry.deleted == [] and dry.dry_run is True
    real = prune(str(store), keep_last=2, keep_every=4)
    assert [r.to_dict() for r in dry.runs] == [r.to_dict() for r in real.runs]
    assert real.deleted == [e.url for e in dry.runs[0].delete]
    assert kept_steps(store) == {9, 8, 7, 3}


def test_deletion_is_oldest_first(
    store: Path, ten: list[restorepoint.PackResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    delete = LocalLocation.delete

    def recording(self: LocalLocation) -> None:
        order.append(self.url)
        delete(self)

    monkeypatch.setattr(LocalLocation, "delete", recording)
    report = prune(str(store), keep_last=3, keep_every=5)
    assert order == [ten[s].url for s in (0, 1, 2, 3, 5, 6)]
    assert report.deleted == order


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90), ("30m", 1800), ("6h", 21600), ("7d", 604800), ("2w", 1209600),
        ("1d12h", 129600), ("1h30m15s", 5415), (" 2H ", 7200), ("0s", 0),
    ],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", " ", "5", "h", "5x", "1.5h", "-1h", "1h 30m", "h1", "1hh", "1h-", "ms"]
)
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "rules",
    [
        {},
        {"keep_last": 0},
        {"keep_every": 0},
        {"keep_within": "soon"},
        {"keep_last": 1, "grace": "1 day"},
    ],
)
def test_prune_refuses_bad_rules(
    store: Path, ten: list[restorepoint.PackResult], rules: dict[str, Any]
) -> None:
    before = store_files(store)
    with pytest.raises(UsageError):
        prune(str(store), **rules)
    assert store_files(store) == before


# -- prune: protections ----------------------------------------------------------------------


def test_a_corrupt_newest_is_kept_with_the_newest_that_verifies(
    store: Path, ten: list[restorepoint.PackResult]
) -> None:
    corrupt(Path(ten[9].url))
    corrupt(Path(ten[8].url))
    report = prune(str(store), keep_last=1)
    assert kept_steps(store) == {9, 8, 7}
    (plan,) = report.runs
    assert plan.verified == name_of(ten[7])
    assert plan.unverified == [name_of(ten[9]), name_of(ten[8])]
    reasons = {e.step: r for e, r in plan.keep}
    assert reasons == {
        9: ["newest", "newer than the newest that verifies", "keep-last 1"],
        8: ["newer than the newest that verifies"],
        7: ["newest that verifies"],
    }
    assert report.deleted == [ten[s].url for s in range(7)]


def test_a_corrupt_older_one_goes_like_any_other(
    store: Path, ten: list[restorepoint.PackResult]
) -> None:
    corrupt(Path(ten[3].url))
    report = prune(str(store), keep_last=2)
    assert kept_steps(store) == {9, 8}
    # Verification stops at the newest that verifies: older ones are never read.
    assert report.runs[0].unverified == []


def test_when_nothing_verifies_nothing_is_deleted(
    store: Path, ten: list[restorepoint.PackResult]
) -> None:
    for result in ten:
        corrupt(Path(result.url))
    before = store_files(store)
    report = prune(str(store), keep_last=1)
    assert store_files(store) == before
    (plan,) = report.runs
    assert plan.verified is None and plan.delete == [] and report.deleted == []
    assert len(plan.unverified) == 10
    assert all("newer than the newest that verifies" in r for _, r in plan.keep)


def test_a_truncated_newest_is_protected_too(
    store: Path, ten: list[restorepoint.PackResult]
) -> None:
    path = Path(ten[9].url)
    path.write_bytes(path.read_bytes()[:-100])
    prune(str(store), keep_last=1)
    assert kept_steps(store) == {9, 8}


def test_prune_is_scoped_to_a_run(source: Path, store: Path) -> None:
    for run in ("a", "b"):
        for s in range(3):
            publish(source, store, run, s, at=s)
    report = prune(str(store), keep_last=1, run="a")
    assert [p.run for p in report.runs] == ["a"]
    assert kept_steps(store, "a") == {2} and kept_steps(store, "b") == {0, 1, 2}
    report = prune(str(store), keep_last=1)
    assert [p.run for p in report.runs] == ["a", "b"]
    assert kept_steps(store, "a") == {2} and kept_steps(store, "b") == {2}
    assert prune(str(store), keep_last=1, run="nobody").runs == []


def test_keep_within_is_relative_to_each_runs_newest(source: Path, store: Path) -> None:
    for s in range(4):
        publish(source, store, "old", s, at=s * 3600)
        publish(source, store, "new", s, at=30 * 86400 + s * 3600)
    prune(str(store), keep_within="1h")
    assert kept_steps(store, "old") == {3, 2}
    assert kept_steps(store, "new") == {3, 2}


# -- prune: leftovers ------------------------------------------------------------------------


def put(path: Path, mtime: float, data: bytes = b"half a restore point") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def test_leftovers_older_than_the_grace_are_deleted(source: Path, store: Path) -> None:
    kept = publish(source, store, "a", 1)
    final = name_of(kept).split("/")[1]
    now = time.time()
    old = now - DEFAULT_GRACE_S - 60
    dead_old = put(store / "a" / partial(final, DEAD_PID, "000000000001"), old)
    dead_young = put(store / "a" / partial(final, DEAD_PID, "000000000002"), now - 60)
    alive_old = put(store / "a" / partial(final, os.getpid(), "000000000003"), old)
    other = put(store / "a" / "notes.txt", old)
    top = put(store / partial("x.rp", DEAD_PID), old)
    dry = prune(str(store), keep_last=1, now=now, dry_run=True)
    assert sorted(dry.leftovers) == sorted([f"{store}/a/{dead_old.name}", f"{store}/{top.name}"])
    assert dead_old.exists() and top.exists()
    report = prune(str(store), keep_last=1, now=now)
    assert sorted(report.leftovers) == sorted(dry.leftovers)
    assert not dead_old.exists() and not top.exists()
    assert dead_young.exists() and alive_old.exists() and other.exists()
    assert Path(kept.url).exists()
    # A shorter grace takes the young one too; a live writer's file stays whatever its age.
    report = prune(str(store), keep_last=1, now=now, grace="30s")
    assert report.leftovers == [f"{store}/a/{dead_young.name}"]
    assert not dead_young.exists() and alive_old.exists()
    report = prune(str(store), keep_last=1, now=now + 10 * DEFAULT_GRACE_S, grace=0)
    assert report.leftovers == [] and alive_old.exists()


def test_leftovers_of_other_runs_are_left_alone_with_run(source: Path, store: Path) -> None:
    publish(source, store, "a", 1)
    publish(source, store, "b", 1)
    now = time.time()
    old = now - 2 * DEFAULT_GRACE_S
    in_a = put(store / "a" / partial("0.rp", DEAD_PID), old)
    in_b = put(store / "b" / partial("0.rp", DEAD_PID), old)
    top = put(store / partial("0.rp", DEAD_PID), old)
    report = prune(str(store), keep_last=1, run="a", now=now)
    assert report.leftovers == [f"{store}/a/{in_a.name}"]
    assert not in_a.exists() and in_b.exists() and top.exists()


# -- S3 --------------------------------------------------------------------------------------


@pytest.mark.s3
def test_a_store_on_s3(
    source: Path, s3_bucket: str, s3_storage_options: dict[str, Any], s3_client: Any
) -> None:
    url = f"s3://{s3_bucket}/store/"
    opts = s3_storage_options
    made = [
        publish(source, url, run, s, at=s, storage_options=opts)
        for run, s in (("a", 1), ("a", 3), ("a", 2), ("b", 1))
    ]
    assert [r.url for r in made] == [url + name_of(r) for r in made]
    # Another run's object under a's name, and a stray key, are never a's restore points.
    s3_client.put_object(Bucket=s3_bucket, Key="store/a/notes.txt", Body=b"x")
    entries = list_store(url, storage_options=opts)
    assert names(entries) == [name_of(made[i]) for i in (1, 2, 0, 3)]  # runs a, b; newest first
    assert entries[0].size == made[1].size
    assert names(list_store(url, run="a", storage_options=opts)) == [
        name_of(made[i]) for i in (1, 2, 0)
    ]
    with pytest.raises(UsageError):
        latest(url, storage_options=opts)
    assert latest(url, run="a", storage_options=opts).url == made[1].url
    assert latest(url, run="a", verify_it=True, storage_options=opts).url == made[1].url

    upload = s3_client.create_multipart_upload(Bucket=s3_bucket, Key="store/a/interrupted.rp")
    # moto reports one fixed Initiated time for every upload: "now" is taken from it.
    (listed,) = s3_client.list_multipart_uploads(Bucket=s3_bucket)["Uploads"]
    initiated = listed["Initiated"].timestamp()
    report = prune(url, keep_last=1, run="a", storage_options=opts, now=initiated + 60)
    assert report.deleted == [made[0].url, made[2].url]
    assert report.leftovers == []  # the upload is younger than the grace
    report = prune(
        url, keep_last=1, run="b", storage_options=opts, now=initiated + 2 * DEFAULT_GRACE_S
    )
    assert report.leftovers == []  # another run's prefix
    report = prune(
        url, keep_last=1, run="a", storage_options=opts, now=initiated + 2 * DEFAULT_GRACE_S
    )
    assert report.deleted == []
    assert len(report.leftovers) == 1 and upload["UploadId"] in report.leftovers[0]
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    keys = sorted(
        o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="store/")["Contents"]
    )
    expected = ["store/a/notes.txt", f"store/{name_of(made[1])}", f"store/{name_of(made[3])}"]
    assert keys == sorted(expected)
    restorepoint.verify(latest(url, run="a", storage_options=opts).url, storage_options=opts)


def test_pack_keep_last_never_deletes_what_it_just_published(source: Path, store: Path) -> None:
    # A run restarted from an older restore point publishes a lower step than its newest: the
    # step it publishes must survive its own prune (it is what the job resumes from next).
    newer = publish(source, store, "r1", 2000, at=1)
    done = publish_ops(
        source, str(store) + "/", HeadSpec(1000, run="r1"), PackOptions(chunk_size=CHUNK),
        keep_last=1,
    )  # fmt: skip
    result, report = done.pack, done.pruned
    assert report is not None
    assert report.deleted == []
    kept = {e.name: reasons for e, reasons in report.runs[0].keep}
    assert kept[name_of(result)] == ["just published"]
    assert "newest" in kept[name_of(newer)]
    assert names(list_store(str(store))) == [name_of(newer), name_of(result)]


def test_prune_of_encrypted_restore_points_verifies_with_the_identity(
    source: Path, store: Path, tmp_path: Path
) -> None:
    from restorepoint import trust

    trust.generate(tmp_path / "id.key", "encryption")
    recipient = trust.load_public(tmp_path / "id.key.pub", "encryption")
    identity = trust.load_identity(tmp_path / "id.key")
    made = [
        publish(source, store, "r", step, at=step, encrypt_to=[recipient]) for step in (1, 2, 3)
    ]
    # Without the key nothing verifies, so nothing may go.
    report = prune(str(store), keep_last=1)
    assert report.deleted == []
    assert len(report.runs[0].unverified) == 3
    with pytest.raises(NotFound):
        latest(str(store), verify_it=True)
    # With it, the newest verifies and the rule applies.
    policy = restorepoint.Trust(identity=identity)
    assert latest(str(store), verify_it=True, trust=policy).url == made[2].url
    report = prune(str(store), keep_last=1, trust=policy)
    assert sorted(report.deleted) == sorted(r.url for r in made[:2])
