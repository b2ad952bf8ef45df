"""Incremental restore points (spec section 28): publishing only what changed into a local store
and into moto's S3, reading through the references (verify, import, materialize), prune keeping
every base of what it keeps, and hostile references refused in one line before anything is
imported."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

from restorepoint import IntegrityError, NotFound, UnsupportedFormat, UsageError, read_manifest
from restorepoint.format import canonical_dumps, read_head, read_prefix, read_tail
from restorepoint.format import manifest as manifest_module
from restorepoint.format.layout import END_MAGIC, FOOTER
from restorepoint.ops import import_restore_point, latest, list_store, prune, verify
from restorepoint.ops.materialize import materialize
from restorepoint.ops.publish import HeadSpec, PackOptions, PublishResult, publish
from restorepoint.storage import resolve

MIB = 1 << 20
FROZEN = 9 * MIB  # 90% of the bytes never change (a frozen backbone)


def _write(src: Path, frozen: bytes, step: int) -> None:
    src.mkdir(exist_ok=True)
    (src / "model.bin").write_bytes(frozen + os.urandom(MIB))
    (src / "state.json").write_text(json.dumps({"step": step}))


def _publish(
    src: Path, store: str, step: int, options: dict[str, Any] | None = None, **kw: Any
) -> PublishResult:
    opts = PackOptions(incremental=True, chunk_size=MIB, codec="none", storage_options=options)
    return publish(str(src), store, HeadSpec(position=step, run="r1"), opts, **kw)


def _head(path: Path) -> Any:
    reader = resolve(str(path)).reader()
    try:
        return read_head(reader).manifest
    finally:
        reader.close()


def _data_start(path: Path) -> int:
    reader = resolve(str(path)).reader()
    try:
        return read_prefix(reader).data_start
    finally:
        reader.close()


def _stored(store: str, options: dict[str, Any] | None) -> dict[str, int]:
    return {e.name: e.size for e in list_store(store, storage_options=options)}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    if request.param == "local":
        return f"{tmp_path}/store/", None
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/store/", request.getfixturevalue("s3_storage_options")


def test_the_second_publish_uploads_only_new_chunks_and_reads_back_bit_for_bit(
    tmp_path: Path, store: tuple[str, dict[str, Any] | None]
) -> None:
    url, options = store
    frozen = os.urandom(FROZEN)
    src = tmp_path / "src"
    _write(src, frozen, 1)
    first = _publish(src, url, 1, options)
    assert first.pack.reused == 0
    assert first.pack.incremental == "no earlier restore point of the run"
    _write(src, frozen, 2)
    second = _publish(src, url, 2, options)
    assert second.pack.reused == FROZEN
    assert second.pack.incremental is not None
    assert second.pack.incremental.startswith("based on r1/")
    # What the store holds is what was uploaded: the second object is the new chunks only.
    sizes = _stored(url, options)
    assert sizes[first.url.split("/store/")[1]] > 10 * MIB
    assert sizes[second.url.split("/store/")[1]] < 0.12 * (10 * MIB)
    assert second.manifest.bases is not None and len(second.manifest.bases) == 1
    report = verify(second.url, storage_options=options)
    assert report.bytes == 10 * MIB + len(json.dumps({"step": 2}))
    dest = tmp_path / "restored"
    import_restore_point(second.url, dest, storage_options=options)
    for name in ("model.bin", "state.json"):
        assert (dest / name).read_bytes() == (src / name).read_bytes()
    # A self-contained copy: the same head, no base, every byte.
    copy = materialize(second.url, str(tmp_path / "copy.rp"), storage_options=options)
    assert copy.size > 10 * MIB
    assert _head(tmp_path / "copy.rp").id == second.manifest.id
    # The base goes: the incremental one no longer verifies (one line naming the base),
    # latest --verify passes over it, and the copy still verifies.
    resolve(first.url, options).delete()
    with pytest.raises(IntegrityError, match=r"base r1/.* is missing"):
        verify(second.url, storage_options=options)
    with pytest.raises(NotFound):
        latest(url, run="r1", verify_it=True, storage_options=options)
    assert verify(str(tmp_path / "copy.rp")).bytes == report.bytes


def test_references_are_flattened_and_prune_keeps_every_base_of_what_it_keeps(
    tmp_path: Path,
) -> None:
    store = f"{tmp_path}/store/"
    frozen = os.urandom(FROZEN)
    src = tmp_path / "src"
    published = []
    for step in (1, 2, 3):
        _write(src, frozen, step)
        published.append(_publish(src, store, step))
    first, second, third = published
    # The third's frozen chunks lie in the first: it names the first, never goes through the
    # second (one hop, whatever the chain).
    assert third.manifest.bases is not None
    assert [b.name for b in third.manifest.bases] == [first.url.split("/store/")[1]]
    report = prune(store, keep_last=1)
    assert report.deleted == [second.url]
    kept = {e.name: reasons for e, reasons in report.runs[0].keep}
    assert any(r.startswith("base of ") for r in kept[first.url.split("/store/")[1]])
    verify(third.url)
    # The publish after the prune still references the first.
    _write(src, frozen, 4)
    fourth = _publish(src, store, 4, keep_last=1)
    assert fourth.pack.reused == FROZEN
    assert fourth.pruned is not None
    assert sorted(fourth.pruned.deleted) == [third.url]
    verify(fourth.url)


def test_full_publishes_reuse_nothing_and_the_policy_forces_a_full_one(tmp_path: Path) -> None:
    from restorepoint.ops._increment import FULL_EVERY

    store = f"{tmp_path}/store/"
    frozen = os.urandom(2 * MIB)
    src = tmp_path / "src"
    results = []
    for step in range(1, FULL_EVERY + 2):
        _write(src, frozen, step)
        results.append(_publish(src, store, step))
    # Each incremental names one base more than its base's (only the first's frozen frames are
    # named, so here one), and the bases never exceed FULL_EVERY - 1.
    assert all(len(r.manifest.bases or ()) <= FULL_EVERY - 1 for r in results)
    assert results[1].pack.reused == 2 * MIB
    # A full publish (--full) after incremental ones is a 1.0 object and names nothing.
    plain = publish(
        str(src), store, HeadSpec(position=99, run="r1"),
        PackOptions(chunk_size=MIB, incremental=False),
    )  # fmt: skip
    assert plain.manifest.bases is None and plain.manifest.format_version == "1.0"


def test_a_run_of_referenced_frames_is_read_in_few_ranged_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One request per BASE_READ_SPAN of a run, not one per frame (on S3 each is a GET); each
    read stays within the span, so memory stays bounded."""
    from restorepoint.format.references import BASE_READ_SPAN
    from restorepoint.ops import _delta

    store = f"{tmp_path}/store/"
    frozen = os.urandom(FROZEN)
    src = tmp_path / "src"
    _write(src, frozen, 1)
    _publish(src, store, 1)
    _write(src, frozen, 2)
    second = _publish(src, store, 2)
    assert second.pack.reused == FROZEN  # 9 frames of one base, in one run
    reads: list[int] = []
    read_range = _delta._Region.read_range

    def counted(self: Any, start: int, end: int) -> bytes:
        reads.append(end - start)
        return read_range(self, start, end)

    monkeypatch.setattr(_delta._Region, "read_range", counted)
    dest = tmp_path / "restored"
    import_restore_point(second.url, dest)
    assert (dest / "model.bin").read_bytes() == (src / "model.bin").read_bytes()
    # Whole frames per read: as many as fit in the span, and every byte read once.
    per_read = BASE_READ_SPAN // (MIB + 4)
    expected = [(MIB + 4) * n for n in [per_read] * (9 // per_read) + [9 % per_read] if n]
    assert reads == expected and len(reads) < 9
    reads.clear()
    assert verify(second.url).bytes == 10 * MIB + len(json.dumps({"step": 2}))
    assert reads == expected


def test_a_publish_that_would_reuse_less_than_min_reuse_is_full_and_says_why(
    tmp_path: Path,
) -> None:
    from restorepoint.format.delta import DELTA_FEATURE
    from restorepoint.ops._increment import MIN_REUSE

    store = f"{tmp_path}/store/"
    src = tmp_path / "src"
    kept = os.urandom(MIB)  # 1 MiB of 10 kept: 10% reused, under MIN_REUSE
    assert MIB < MIN_REUSE * 10 * MIB
    _write(src, kept + os.urandom(8 * MIB), 1)
    first = _publish(src, store, 1)
    _write(src, kept + os.urandom(8 * MIB), 2)
    second = _publish(src, store, 2)
    assert second.pack.incremental == f"it would reuse less than {MIN_REUSE:.0%} of its bytes"
    assert not second.manifest.bases and second.pack.reused == 0
    assert second.pack.size > 10 * MIB  # every byte uploaded
    # A one-shot publish (no rest) still names its chunks, so that the next can reference it:
    # its format never depends on what this process published before.
    assert DELTA_FEATURE in second.manifest.required_features
    # With enough reuse (4 of its 10 MiB are chunks of the second), the next one is
    # incremental again, based on the newest.
    _write(src, kept + _second_tail(src, 3 * MIB) + os.urandom(5 * MIB), 3)
    third = _publish(src, store, 3)
    assert third.manifest.bases is not None and third.pack.reused >= MIN_REUSE * 10 * MIB
    assert [b.name for b in third.manifest.bases] == [second.url.split("/store/")[1]]
    verify(third.url)
    verify(first.url)


def test_a_publisher_that_rests_names_no_chunks_for_its_next_publishes(tmp_path: Path) -> None:
    # A publisher that publishes a run's restore points one after another keeps a Rest: after a
    # publish that would reuse too little, that one and the next REST name no chunks (the older
    # format: no per-chunk sha256, no listing, no estimate), then it names them again (28.4).
    from restorepoint.format.delta import DELTA_FEATURE
    from restorepoint.ops._increment import MIN_REUSE
    from restorepoint.ops.publish import Rest

    rest = Rest(2)
    store = f"{tmp_path}/store/"
    src = tmp_path / "src"
    kept = os.urandom(MIB)
    _write(src, kept + os.urandom(8 * MIB), 1)
    first = _publish(src, store, 1, rest=rest)
    assert DELTA_FEATURE in first.manifest.required_features  # nothing to reuse yet: it names
    _write(src, kept + os.urandom(8 * MIB), 2)
    second = _publish(src, store, 2, rest=rest)
    assert second.pack.incremental == f"it would reuse less than {MIN_REUSE:.0%} of its bytes"
    assert DELTA_FEATURE not in second.manifest.required_features
    assert second.manifest.format_version != first.manifest.format_version
    # Another run into the same store by the same publisher neither takes nor ends the rest.
    other = publish(
        str(src),
        store,
        HeadSpec(position=9, run="r2"),
        PackOptions(incremental=True, chunk_size=MIB, codec="none"),
        rest=rest,
    )
    assert DELTA_FEATURE in other.manifest.required_features
    resting = [_publish(src, store, step, rest=rest) for step in (3, 4)]
    for result, left in zip(resting, (2, 1), strict=True):
        assert result.pack.incremental == (
            f"the run's state changed too much at a recent publish ({left} more)"
        )
        assert DELTA_FEATURE not in result.manifest.required_features
        assert result.pack.size > 10 * MIB
    # Then it names its chunks again (its newest names none: nothing to reference yet) ...
    named = _publish(src, store, 5, rest=rest)
    assert named.pack.incremental is not None and "names no chunks" in named.pack.incremental
    assert DELTA_FEATURE in named.manifest.required_features and not named.manifest.bases
    # ... and with enough reuse (4 of its 10 MiB are chunks of that one), the next one is
    # incremental again, based on the newest.
    _write(src, kept + _second_tail(src, 3 * MIB) + os.urandom(5 * MIB), 6)
    sixth = _publish(src, store, 6, rest=rest)
    assert sixth.manifest.bases is not None and sixth.pack.reused >= MIN_REUSE * 10 * MIB
    assert [b.name for b in sixth.manifest.bases] == [named.url.split("/store/")[1]]
    for result in (first, second, other, *resting, named, sixth):
        verify(result.url)


def test_a_publisher_that_expects_little_reuse_rests_from_the_run_s_first_publish(
    tmp_path: Path,
) -> None:
    # Where the store holds nothing of the run, no reuse can be measured: a publisher that
    # knows its training changes most of its state (Rest.expect below MIN_REUSE) names no
    # chunks in the run's first restore point and rests from there (spec 28.4). One that
    # expects reuse, or knows nothing, names them; and once the store holds one of the run,
    # the reuse is measured, whatever is expected.
    from restorepoint.format.delta import DELTA_FEATURE
    from restorepoint.ops._increment import NO_EARLIER
    from restorepoint.ops.publish import Rest

    src = tmp_path / "src"
    kept = os.urandom(9 * MIB)
    _write(src, kept, 1)
    for expected, names in ((None, True), (0.9, True), (0.25, True), (0.1, False), (0.0, False)):
        store = f"{tmp_path}/store-{expected}/"
        rest = Rest(2)
        rest.expect(expected)
        first = _publish(src, store, 1, rest=rest)
        assert (DELTA_FEATURE in first.manifest.required_features) is names, expected
        if names:
            assert first.pack.incremental == NO_EARLIER
            assert rest.take(store, "r1") == 0
        else:
            assert first.pack.incremental == (
                f"{NO_EARLIER}, and its publisher expects it to reuse less than 25% of its bytes"
            )
            # The rest started: the next two name no chunks either, then the third does.
            assert [_publish(src, store, s, rest=rest).pack.incremental for s in (2, 3)] == [
                f"the run's state changed too much at a recent publish ({left} more)"
                for left in (2, 1)
            ]
            third = _publish(src, store, 4, rest=rest)
            assert DELTA_FEATURE in third.manifest.required_features
            # Now that the store holds the run's chunks, the reuse is measured: 90% kept
            # (the frozen 9 MiB) is referenced, although the publisher expects none.
            _write(src, kept, 5)
            fifth = _publish(src, store, 5, rest=rest)
            assert fifth.manifest.bases and fifth.pack.reused >= 9 * MIB
            verify(fifth.url)
        verify(first.url)
    with pytest.raises(ValueError, match="share from 0 to 1"):
        Rest().expect(1.5)
    # The expectation travels with a pickled publisher.
    import pickle

    rest = Rest()
    rest.expect(0.125)
    assert pickle.loads(pickle.dumps(rest)).expected == 0.125


def test_a_rest_is_taken_one_publish_at_a_time_for_its_own_store_and_run() -> None:
    from restorepoint.ops._increment import REST
    from restorepoint.ops.publish import Rest

    assert Rest().length == REST
    rest = Rest(2)
    assert rest.take("s3://b/store/", "r1") == 0  # not started
    rest.start("s3://b/store/", "r1")
    assert rest.take("s3://b/other/", "r1") == 0  # another store
    assert rest.take("s3://b/store/", "r2") == 0  # another run
    assert [rest.take("s3://b/store/", "r1") for _ in range(3)] == [2, 1, 0]
    rest.start("s3://b/store/", "r1")  # a new low reuse starts it again
    assert rest.take("s3://b/store/", "r1") == 2
    # A publisher that holds one may be pickled or copied (a Lightning callback under
    # ddp_spawn): the copy goes on with the count.
    import copy
    import pickle

    for again in (pickle.loads(pickle.dumps(rest)), copy.deepcopy(rest)):
        assert again.take("s3://b/store/", "r1") == 1
        assert again.take("s3://b/store/", "r1") == 0
    # Counts per store and run (a rank's part and the shared part rest on their own), at
    # most MAX_RESTING of them, the oldest forgotten first.
    many = Rest(2)
    for n in range(Rest.MAX_RESTING + 1):
        many.start("s3://b/store/", f"r{n}")
    assert many.take("s3://b/store/", "r0") == 0
    assert many.take("s3://b/store/", f"r{Rest.MAX_RESTING}") == 2
    assert many.take("s3://b/store/", "r1") == 2


class _Counted(io.BytesIO):
    """A source file in memory that counts the bytes read from it."""

    def __init__(self, data: bytes, reads: list[int]) -> None:
        super().__init__(data)
        self.reads = reads

    def read(self, n: int | None = -1, /) -> bytes:
        out = super().read(n)
        self.reads.append(len(out))
        return out


@pytest.mark.parametrize(("held", "enough"), [(0.0, False), (0.2, False), (0.3, True), (0.9, True)])
def test_the_reuse_is_estimated_from_a_bounded_sample_spread_over_the_bytes(
    held: float, enough: bool
) -> None:
    """W4c (spec 28.4): the writer decides from the chunks under evenly spread positions,
    reading at most SAMPLE_BYTES of a larger state, not the whole source a second time."""
    from restorepoint.format.writer import DeltaPlan
    from restorepoint.ops._increment import SAMPLE_BYTES, enough_reuse, sample_points
    from restorepoint.ops._source import SourceFile

    total = 2 * SAMPLE_BYTES
    data = os.urandom(total)
    cut = int(held * total) // MIB * MIB  # the first `held` of the bytes are in the base
    plan = DeltaPlan(
        (), {hashlib.sha256(data[i : i + MIB]).hexdigest(): (0, 0, MIB) for i in range(0, cut, MIB)}
    )
    reads: list[int] = []
    halves = [data[: total // 2], data[total // 2 :]]
    files = [
        SourceFile(f"f{i}", f"f{i}", len(half), lambda half=half: _Counted(half, reads))
        for i, half in enumerate(halves)
    ]
    assert enough_reuse(files, MIB, [None, None], plan) is enough
    assert sum(reads) <= sample_points(MIB) * MIB <= SAMPLE_BYTES < total
    # A state of at most SAMPLE_BYTES is hashed whole: exact.
    reads.clear()
    small = [SourceFile("s", "s", 4 * MIB, lambda: _Counted(data[: 4 * MIB], reads))]
    assert enough_reuse(small, MIB, [None], plan) is (cut >= MIB)
    assert sum(reads) == 4 * MIB


def _second_tail(src: Path, n: int) -> bytes:
    """The ``n`` bytes of the model after its first MiB: chunks the newest one holds."""
    return (src / "model.bin").read_bytes()[MIB : MIB + n]


# -- hostile references ------------------------------------------------------------------------


def _rewrite_index(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the index of the object at ``path`` (digest and footer recomputed), so that the
    one fault ``change`` plants is the only one."""
    data = path.read_bytes()
    reader = resolve(str(path)).reader()
    try:
        prefix = read_prefix(reader)
        tail = read_tail(reader, prefix.data_start)
    finally:
        reader.close()
    index = json.loads(data[tail.index_offset : tail.index_offset + tail.index_length])
    change(index)
    new = canonical_dumps(index)
    footer = FOOTER.pack(tail.index_offset, len(new), hashlib.sha256(new).digest(), 0, END_MAGIC)
    path.write_bytes(data[: tail.index_offset] + new + footer)


def _entry(index: dict[str, Any]) -> dict[str, Any]:
    (model,) = [e for e in index["payload"] if e["path"] == "model.bin"]
    return model


def _other_run(index: dict[str, Any]) -> None:
    index["bases"][0]["name"] = "r2/" + index["bases"][0]["name"].split("/", 1)[1]


def _no_such_digest(index: dict[str, Any]) -> None:
    index["bases"][0]["digest"] = "0" * 64


def _no_such_base(index: dict[str, Any]) -> None:
    index["bases"][0]["name"] = "r1/0000000000000009-20261206T000000000Z-abcdefabcdef.rp"


def _into_the_head(index: dict[str, Any]) -> None:
    _entry(index)["refs"][0][3] = 0


def _past_the_end(index: dict[str, Any]) -> None:
    _entry(index)["refs"][0][3] = 1 << 40


def _wrong_length(index: dict[str, Any]) -> None:
    _entry(index)["refs"][0][4] += 1


def _shifted(index: dict[str, Any]) -> None:
    _entry(index)["refs"][0][3] += 4


def _too_many_bases(index: dict[str, Any]) -> None:
    stem = index["bases"][0]["name"].split("/", 1)[1]
    index["bases"] += [
        {"digest": f"{i:064x}", "name": f"r1/{stem[:-6]}{i:03d}aaa.rp"} for i in range(1, 17)
    ]


def _a_cycle(index: dict[str, Any]) -> None:
    """Written where the base lies: the object names itself."""


HOSTILE = {
    "another run": (_other_run, "another run"),
    "a digest no base has": (_no_such_digest, "has changed"),
    "a base that does not exist": (_no_such_base, "is missing"),
    "into the base's head": (_into_the_head, "outside its data region"),
    "past the base's end": (_past_the_end, "outside its data region"),
    "a wrong length": (_wrong_length, "their frames are"),
    "a frame boundary moved": (_shifted, "base r1/"),
    "more bases than the limit": (_too_many_bases, "the limit is 16"),
}


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("chain")
    frozen = os.urandom(3 * MIB)
    src = root / "src"
    _write(src, frozen, 1)
    first = _publish(src, f"{root}/store/", 1)
    _write(src, frozen, 2)
    second = _publish(src, f"{root}/store/", 2)
    return Path(first.url), Path(second.url)


@pytest.mark.parametrize("fault", [*HOSTILE, "itself"])
def test_a_hostile_reference_is_refused_in_one_line_and_nothing_is_imported(
    fault: str, chain: tuple[Path, Path], tmp_path: Path
) -> None:
    base, good = chain
    run_dir = tmp_path / "store" / "r1"
    run_dir.mkdir(parents=True)
    shutil.copy(base, run_dir / base.name)
    target = run_dir / good.name
    shutil.copy(good, target)
    if fault == "itself":

        def change(index: dict[str, Any]) -> None:
            index["bases"][0]["name"] = f"r1/{good.name}"

        expected = "is the restore point itself"
    else:
        change, expected = HOSTILE[fault]
    _rewrite_index(target, change)
    proc = cli("verify", str(target))
    assert proc.returncode == 1, proc.stderr
    assert expected in one_error_line(proc)
    dest = tmp_path / "out"
    proc = cli("import", str(target), str(dest))
    assert proc.returncode == 1, proc.stderr
    assert expected in one_error_line(proc)
    assert not dest.exists()
    assert sorted(os.listdir(tmp_path)) == ["store"]


def test_a_changed_base_fails_in_one_line_naming_it(
    chain: tuple[Path, Path], tmp_path: Path
) -> None:
    base, good = chain
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    copied = run_dir / base.name
    shutil.copy(base, copied)
    shutil.copy(good, run_dir / good.name)
    # One byte of a referenced frame flipped: the base's head and index still match.
    data = bytearray(copied.read_bytes())
    data[_data_start(copied) + 100] ^= 1
    copied.write_bytes(bytes(data))
    proc = cli("verify", str(run_dir / good.name))
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "model.bin" in line and f"from base r1/{base.name}" in line


def test_a_reader_without_delta_1_refuses_it_at_the_head(
    chain: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, good = chain
    reader = resolve(str(good)).reader()
    try:
        assert read_head(reader).manifest.format_version == "1.2"
        # A 1.1 reader: what it knows.
        monkeypatch.setattr(
            manifest_module,
            "KNOWN_FEATURES",
            frozenset({"encryption/1", "multipart/1", "planes/1"}),
        )
        with pytest.raises(UnsupportedFormat, match="unknown required feature: delta/1"):
            read_head(reader)
    finally:
        reader.close()


def test_delta_1_goes_with_1_2_a_run_no_encryption_and_no_commit() -> None:
    from restorepoint import MalformedManifest
    from restorepoint.ops.spec import HeadSpec as Spec

    head = Spec(position=1, run="r1").head().head_dict()
    head["required_features"] = ["delta/1"]
    with pytest.raises(MalformedManifest, match=r"1\.2"):
        manifest_module.Manifest.from_head_dict(head)
    head["format_version"] = "1.2"
    assert manifest_module.Manifest.from_head_dict(head).required_features == ("delta/1",)
    with pytest.raises(MalformedManifest, match="needs a run"):
        manifest_module.Manifest.from_head_dict({**head, "run": None})
    # A part may be incremental (spec 28.7), a commit never (its payload is empty).
    part = {"commit": "ab" * 16, "rank": 1, "world_size": 2}
    both = ["delta/1", "multipart/1"]
    parsed = manifest_module.Manifest.from_head_dict(
        {**head, "required_features": both, "part": part}
    )
    assert parsed.part is not None
    assert parsed.part.rank == 1
    with pytest.raises(MalformedManifest, match="a commit is never"):
        manifest_module.Manifest.from_head_dict(
            {**head, "required_features": both, "parts": {"world_size": 1}}
        )


def test_the_cli_publishes_incrementally_by_default_into_a_store_and_full_elsewhere(
    tmp_path: Path,
) -> None:
    """pack into a store is incremental with no flag (the second publish of a frozen run
    references the first), --full packs the older format with no delta/1, a DEST that is not
    a store is full whatever the default, and --incremental there is a usage error."""
    frozen = os.urandom(8 * MIB)  # two chunks of the default 4 MiB
    src = tmp_path / "src"
    store = f"{tmp_path}/store/"
    out = []
    for step, flags in ((1, ["--incremental"]), (2, []), (3, ["--full"])):
        _write(src, frozen, step)
        proc = cli("pack", str(src), store, "--run", "r1", "--step", str(step), "--json", *flags)
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout))
    assert out[0]["incremental"]["reused"] == 0
    assert out[1]["incremental"] == {"reason": f"based on {_name(out[0])}", "reused": 8 * MIB}
    second = read_manifest(out[1]["url"])
    assert second.format_version == "1.2" and "delta/1" in second.required_features
    assert [b.name for b in second.bases or ()] == [_name(out[0])]
    # --full: every byte, in the format a 1.0 or 1.1 reader reads.
    assert "incremental" not in out[2]
    third = read_manifest(out[2]["url"])
    assert third.format_version == "1.0" and "delta/1" not in third.required_features
    assert third.bases is None and out[2]["size"] > 8 * MIB
    proc = cli("materialize", store, "--latest", "--run", "r1", str(tmp_path / "whole.rp"))
    assert proc.returncode == 0, proc.stderr
    # A DEST that is not a store: full, with no flag; --incremental there is refused.
    proc = cli("pack", str(src), str(tmp_path / "x.rp"), "--step", "3", "--run", "r1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "incremental" not in json.loads(proc.stdout)
    assert read_manifest(str(tmp_path / "x.rp")).format_version == "1.0"
    proc = cli("pack", str(src), str(tmp_path / "y.rp"), "--step", "3", "--incremental")
    assert proc.returncode == 2
    assert "store" in one_error_line(proc)


def test_the_library_default_is_incremental_into_a_store_unless_encrypted(
    tmp_path: Path,
) -> None:
    """PackOptions() (incremental=None): into a store, incremental; encrypted, full with no
    error (incremental=True refuses it); a materialized copy of the default one verifies."""
    from restorepoint.trust import generate, load_public

    frozen = os.urandom(FROZEN)
    src = tmp_path / "src"
    store = f"{tmp_path}/store/"
    auto = PackOptions(chunk_size=MIB, codec="none")
    _write(src, frozen, 1)
    first = publish(str(src), store, HeadSpec(position=1, run="r1"), auto)
    _write(src, frozen, 2)
    second = publish(str(src), store, HeadSpec(position=2, run="r1"), auto)
    assert second.pack.reused == FROZEN
    assert [b.digest for b in second.manifest.bases or ()] == [first.pack.digest]
    _, public = generate(tmp_path / "x25519", "encryption")
    sealed = replace(auto, encrypt_to=(load_public(public, "encryption"),))
    third = publish(str(src), store, HeadSpec(position=3, run="r1"), sealed)
    assert third.pack.incremental is None and third.manifest.format_version == "1.0"
    with pytest.raises(UsageError, match="cannot be encrypted"):
        publish(str(src), store, HeadSpec(position=4, run="r1"), replace(sealed, incremental=True))


def _name(result: dict[str, Any]) -> str:
    return str(result["url"]).split("/store/")[1]


def test_the_schema_validates_an_incremental_manifest_and_its_index(
    chain: tuple[Path, Path],
) -> None:
    from jsonschema import Draft202012Validator

    from restorepoint.ops import read_manifest

    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "spec" / "manifest.schema.json").read_text()
    )
    _, good = chain
    manifest = read_manifest(str(good))
    assert manifest.bases
    doc = manifest.to_dict()
    assert list(Draft202012Validator(schema).iter_errors(doc)) == []
    doc["payload"][0]["refs"] = [[0, 1, 0]]
    assert list(Draft202012Validator(schema).iter_errors(doc)) != []


def test_tensors_that_move_are_found_whole_in_torch_zips_and_safetensors(tmp_path: Path) -> None:
    """Lightning's .ckpt grows a pickle before its tensors, the runtime's file a JSON header:
    every tensor moves, and tensor-aligned cuts still find the frozen ones (spec 28.4)."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    frozen = torch.randn(2 * MIB)  # 8 MiB of float32
    src = tmp_path / "src"
    src.mkdir()
    store = f"{tmp_path}/store/"
    results = []
    for step in (1, 2):
        trained = torch.randn(MIB // 4)  # 1 MiB
        torch.save({"log": list(range(100 * step)), "frozen": frozen, "trained": trained},
                   src / "last.ckpt")  # fmt: skip
        safetensors_torch.save_file(
            {"frozen": frozen, "trained": trained},
            str(src / "model.safetensors"),
            metadata={"rng": "x" * (10 * step)},
        )
        results.append(
            publish(
                str(src),
                store,
                HeadSpec(position=step, run="r1"),
                PackOptions(incremental=True, codec="none"),
            )
        )
    # Both frozen tensors, and a few small members that did not change either.
    assert 2 * 8 * MIB <= results[1].pack.reused < 2 * 8 * MIB + 4096
    assert results[1].pack.size < 0.25 * results[0].pack.size
    verify(results[1].url)
    dest = tmp_path / "out"
    import_restore_point(results[1].url, dest)
    for name in ("last.ckpt", "model.safetensors"):
        assert (dest / name).read_bytes() == (src / name).read_bytes()


def test_fsck_reports_a_dangling_reference_from_the_index_alone(tmp_path: Path) -> None:
    from restorepoint.ops.fsck import fsck

    store = f"{tmp_path}/store/"
    frozen = os.urandom(2 * MIB)
    src = tmp_path / "src"
    _write(src, frozen, 1)
    first = _publish(src, store, 1)
    _write(src, frozen, 2)
    second = _publish(src, store, 2)
    assert fsck(store).clean
    os.remove(first.url)
    report = fsck(store)
    (finding,) = report.findings
    assert finding.kind == "dangling_reference"
    assert finding.url == second.url
    assert "is not in the store" in finding.detail
    proc = cli("fsck", store)
    assert proc.returncode == 1
    assert any(line.startswith("defect    dangling ref") for line in proc.stdout.splitlines())


def test_a_prune_stopped_after_any_delete_leaves_every_kept_one_verifiable(
    tmp_path: Path,
) -> None:
    """A prune deletes one object at a time, oldest first, and never a base of what it keeps:
    whichever delete it is killed after (each one prefix of its plan), every restore point it
    keeps verifies."""
    store = f"{tmp_path}/store/"
    frozen = os.urandom(2 * MIB)
    src = tmp_path / "src"
    for step in range(1, 7):
        # A new frozen part at step 4: the newest ones reference steps 1 and 4.
        if step == 4:
            frozen = frozen[:MIB] + os.urandom(MIB)
        _write(src, frozen, step)
        _publish(src, store, step)
    plan = prune(store, keep_last=2, dry_run=True)
    kept = [e for e, _ in plan.runs[0].keep]
    doomed = plan.runs[0].delete
    assert {e.step for e in kept} == {1, 4, 5, 6} and {e.step for e in doomed} == {2, 3}
    for entry in doomed:
        os.remove(entry.url)
        for survivor in kept:
            verify(survivor.url)
    # The prune run again finishes the job and deletes nothing it keeps.
    assert prune(store, keep_last=2).deleted == []


def test_an_incremental_one_whose_base_went_away_is_replaced_by_a_full_one(
    tmp_path: Path,
) -> None:
    """Spec 28.4: the verification after the commit fails (here: the base deleted between the
    plan and the verification), so a full restore point is published in its place, under a
    name of its own, and it is the run's newest that verifies."""
    from restorepoint.ops.publish import _verified_or_full

    url = f"{tmp_path}/store/"
    frozen = os.urandom(FROZEN)
    src = tmp_path / "src"
    _write(src, frozen, 1)
    first = _publish(src, url, 1)
    _write(src, frozen, 2)
    second = _publish(src, url, 2)
    assert second.pack.manifest.bases
    Path(first.url).unlink()
    with pytest.raises(IntegrityError, match="is missing"):
        verify(second.url)
    opts = PackOptions(incremental=True, chunk_size=MIB, codec="none")
    spec = HeadSpec(position=2, run="r1")
    replaced = _verified_or_full(second.pack, str(src), resolve(url), spec, opts, None)
    assert replaced.url != second.url
    assert not replaced.manifest.bases
    assert verify(replaced.url).files == 2
    assert latest(url, verify_it=True).url == replaced.url


def test_the_check_after_the_commit_reads_no_payload_and_catches_a_changed_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spec 28.4: after the commit every base is opened as R9a opens it and every reference is
    placed inside one, with no frame read (frames are checked at every read); a base that is
    not the one named (here: replaced by another restore point under its name) fails it."""
    from restorepoint.ops import _delta
    from restorepoint.ops._delta import check_bases
    from restorepoint.ops.publish import _verified_or_full

    url = f"{tmp_path}/store/"
    frozen = os.urandom(FROZEN)
    src = tmp_path / "src"
    _write(src, frozen, 1)
    first = _publish(src, url, 1)
    reads: list[int] = []
    read_range = _delta._Region.read_range

    def counted(self: Any, start: int, end: int) -> bytes:
        reads.append(end - start)
        return read_range(self, start, end)

    monkeypatch.setattr(_delta._Region, "read_range", counted)
    _write(src, frozen, 2)
    second = _publish(src, url, 2)
    assert [b.name for b in second.manifest.bases or ()] == [first.url.split("/store/")[1]]
    assert reads == []  # no frame of the base was read by the publish
    # The base replaced by another restore point under its name: its digest differs.
    other = publish(
        str(src), f"{tmp_path}/other.rp", HeadSpec(position=1, run="r1"),
        PackOptions(incremental=False, chunk_size=MIB, codec="none"),
    )  # fmt: skip
    shutil.copyfile(other.url, first.url)
    with pytest.raises(IntegrityError, match="has changed"):
        check_bases(resolve(second.url), second.manifest)
    opts = PackOptions(incremental=True, chunk_size=MIB, codec="none")
    replaced = _verified_or_full(
        second.pack, str(src), resolve(url), HeadSpec(position=2, run="r1"), opts, None
    )
    assert replaced.url != second.url and not replaced.manifest.bases
    assert reads == []
