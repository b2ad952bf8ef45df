"""pack: what a source may hold, what a caller may ask, and that a failed pack publishes
nothing and leaves the previous restore point as it was."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import ConfigError, NotFound, SourceError, UsageError

CHUNK = 65536


def pack(source: Path, dest: Path, **options: Any) -> restorepoint.PackResult:
    options.setdefault("position", 7)
    options.setdefault("chunk_size", CHUNK)
    options.setdefault("threads", 2)
    return restorepoint.pack(source, str(dest), **options)


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def entries(result: restorepoint.PackResult) -> dict[str, str]:
    assert result.manifest.payload is not None
    return {e.path: e.sha256 for e in result.manifest.payload}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def previous(tmp_path: Path) -> tuple[Path, bytes]:
    """A restore point already published at DEST, as a failed pack must leave it."""
    old = tree(tmp_path / "old", {"old.bin": b"the previous restore point" * 100})
    dest = tmp_path / "out" / "rp.rpt"
    pack(old, dest, position=1)
    return dest, dest.read_bytes()


def assert_untouched(dest: Path, before: bytes) -> None:
    assert dest.read_bytes() == before
    assert listing(dest.parent) == [dest.name]  # no partial file left beside it
    restorepoint.verify(str(dest))


# -- source rules -----------------------------------------------------------------------------


def test_symlink_to_a_file_inside_is_packed_as_a_regular_file(tmp_path: Path) -> None:
    data = os.urandom(CHUNK + 3)
    src = tree(tmp_path / "src", {"real.bin": data, "sub/other.bin": b"other"})
    (src / "link.bin").symlink_to("real.bin")
    (src / "sub" / "up.bin").symlink_to("../real.bin")
    (src / "abs.bin").symlink_to(src / "sub" / "other.bin")
    (src / "chain.bin").symlink_to("link.bin")
    result = pack(src, tmp_path / "rp.rpt")
    assert entries(result) == {
        "abs.bin": sha(b"other"),
        "chain.bin": sha(data),
        "link.bin": sha(data),
        "real.bin": sha(data),
        "sub/other.bin": sha(b"other"),
        "sub/up.bin": sha(data),
    }
    assert result.bytes == 4 * len(data) + 2 * len(b"other")
    restorepoint.verify(str(tmp_path / "rp.rpt"))


def test_symlink_leading_out_of_the_source(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"outside")
    src = tree(tmp_path / "src", {"a": b"a"})
    (src / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(SourceError, match="leads out") as info:
        pack(src, tmp_path / "rp.rpt")
    assert info.value.url is not None
    assert info.value.url.endswith("leak")
    assert listing(tmp_path) == ["secret", "src"]


def test_relative_symlink_leading_out(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"outside")
    src = tree(tmp_path / "src", {"d/a": b"a"})
    (src / "d" / "leak").symlink_to("../../secret")
    with pytest.raises(SourceError, match="leads out"):
        pack(src, tmp_path / "rp.rpt")


def test_dangling_symlink(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    (src / "gone").symlink_to("nowhere")
    with pytest.raises(SourceError, match="dangling"):
        pack(src, tmp_path / "rp.rpt")
    assert not (tmp_path / "rp.rpt").exists()


def test_fifo_inside_the_source(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    os.mkfifo(src / "pipe")
    with pytest.raises(SourceError, match="not a regular file"):
        pack(src, tmp_path / "rp.rpt")


def test_fifo_as_the_source(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(SourceError, match="neither a regular file nor a directory"):
        pack(tmp_path / "pipe", tmp_path / "rp.rpt")


def test_symlink_to_a_fifo_inside(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    os.mkfifo(src / "pipe")
    (src / "b").symlink_to("pipe")
    with pytest.raises(SourceError):
        pack(src, tmp_path / "rp.rpt")


def test_symlinked_directory(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"d/a": b"a"})
    (src / "alias").symlink_to("d", target_is_directory=True)
    with pytest.raises(SourceError, match="directory"):
        pack(src, tmp_path / "rp.rpt")


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as info:
        pack(tmp_path / "nothing", tmp_path / "out" / "rp.rpt")
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.url == str(tmp_path / "nothing")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "names",
    [
        ["back\\slash"],
        ["new\nline"],
        ["Model.pt", "model.pt"],
        ["stra\u00dfe", "strasse"],
    ],
)
def test_names_a_restore_point_cannot_hold(tmp_path: Path, names: list[str]) -> None:
    src = tree(tmp_path / "src", {name: b"x" for name in names})
    with pytest.raises(SourceError, match="cannot be packed"):
        pack(src, tmp_path / "rp.rpt")
    assert listing(tmp_path) == ["src"]


def test_unreadable_file(tmp_path: Path, previous: tuple[Path, bytes]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    dest, before = previous
    src = tree(tmp_path / "src", {"a": b"a", "b": b"b"})
    (src / "b").chmod(0)
    with pytest.raises(SourceError, match="cannot open"):
        pack(src, dest)
    assert_untouched(dest, before)


# -- the source changes while it is packed ------------------------------------------------------


def change_after_listing(path: Path, change: Callable[[Path], None]) -> Callable[[int], None]:
    """An on_start callback: it runs after the source was listed, before a byte is read."""

    def on_start(total: int) -> None:
        assert total > 0
        change(path)

    return on_start


def grow(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"more")


def shrink(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1)


def replace_with_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (grow, "grew"),
        (shrink, "shrank"),
        (Path.unlink, "cannot open"),
        (replace_with_directory, "cannot open"),
    ],
)
@pytest.mark.parametrize("size", [10, CHUNK, 2 * CHUNK + 5])
def test_file_changes_after_listing(
    tmp_path: Path,
    previous: tuple[Path, bytes],
    change: Callable[[Path], None],
    why: str,
    size: int,
) -> None:
    dest, before = previous
    src = tree(tmp_path / "src", {"a.bin": b"a" * 100, "m/b.bin": os.urandom(size), "z": b"z"})
    with pytest.raises(SourceError, match=why) as info:
        pack(src, dest, on_start=change_after_listing(src / "m" / "b.bin", change))
    assert info.value.url == str(src / "m" / "b.bin")
    assert_untouched(dest, before)


@pytest.mark.parametrize(("change", "why"), [(grow, "grew"), (shrink, "shrank")])
def test_file_changes_while_it_is_read(
    tmp_path: Path, previous: tuple[Path, bytes], change: Callable[[Path], None], why: str
) -> None:
    dest, before = previous
    target = tree(tmp_path / "src", {"big.bin": os.urandom(3 * CHUNK)}) / "big.bin"
    calls = []

    def progress(n: int) -> None:
        calls.append(n)
        if len(calls) == 1:  # after the first chunk of three
            change(target)

    with pytest.raises(SourceError, match=why):
        pack(tmp_path / "src", dest, progress=progress, level=None)
    assert_untouched(dest, before)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
@pytest.mark.parametrize("level", [None, 1])
def test_an_exception_during_pack_publishes_nothing(
    tmp_path: Path, previous: tuple[Path, bytes], error: BaseException, level: int | None
) -> None:
    dest, before = previous
    src = tree(tmp_path / "src", {"a.bin": os.urandom(4 * CHUNK), "b.bin": b"b"})
    calls = []

    def progress(n: int) -> None:
        calls.append(n)
        if len(calls) == 2:
            raise error

    with pytest.raises(type(error)):
        pack(src, dest, progress=progress, level=level)
    assert_untouched(dest, before)


def test_a_failed_pack_to_a_new_name_leaves_nothing(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"a.bin": os.urandom(CHUNK + 1)})
    out = tmp_path / "out"
    with pytest.raises(SourceError):
        pack(src, out / "rp.rpt", on_start=change_after_listing(src / "a.bin", grow))
    assert listing(out) == []


# -- what a caller may ask ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"chunk_size": 0}, UsageError),
        ({"chunk_size": 32768}, UsageError),
        ({"chunk_size": 65537}, UsageError),
        ({"chunk_size": 3 * CHUNK}, UsageError),
        ({"chunk_size": 1 << 27}, UsageError),
        ({"level": 23}, UsageError),
        ({"level": -8}, UsageError),
        ({"level": True}, UsageError),
        ({"level": 1.5}, UsageError),
        ({"level": "3"}, UsageError),
        ({"operational_keys": [""]}, UsageError),
        ({"operational_keys": ["a..b"]}, UsageError),
        ({"operational_keys": ["train."]}, UsageError),
        ({"operational_keys": [5]}, UsageError),
        ({"terms": {"torch": 2}}, UsageError),
        ({"terms": {"": "x"}}, UsageError),
        ({"terms": {1: "x"}}, UsageError),
        ({"cache_keys": {"data": None}}, UsageError),
        ({"trainer": ("", "1")}, UsageError),
        ({"trainer": ("t", 1)}, UsageError),
        ({"config": {"lr": float("nan")}}, ConfigError),
        ({"config": {"lr": float("inf")}}, ConfigError),
        ({"config": {"steps": 2**53}}, ConfigError),
        ({"config": {1: "a"}}, ConfigError),
        ({"config": {"x": object()}}, ConfigError),
    ],
)
def test_invalid_options_are_refused_before_anything_is_written(
    tmp_path: Path, options: dict[str, Any], expected: type[UsageError]
) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    with pytest.raises(expected):
        pack(src, tmp_path / "out" / "rp.rpt", **options)
    assert not (tmp_path / "out").exists()


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_config_nesting_is_limited(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    # the head's own level plus 63 levels of config: exactly the readers' limit of 64
    result = pack(src, tmp_path / "ok.rpt", config=nested(63))
    assert restorepoint.verify(str(tmp_path / "ok.rpt")).manifest.config == nested(63)
    assert result.manifest.config == nested(63)
    for depth in (64, 10000):
        with pytest.raises(ConfigError, match="nested deeper"):
            pack(src, tmp_path / "out" / "deep.rpt", config=nested(depth))
    assert not (tmp_path / "out").exists()


def test_large_floats_in_the_config_round_trip(tmp_path: Path) -> None:
    # 1e20 is written as the integer literal 100000000000000000000 (RFC 8785)
    config = {"big": 1e20, "bigger": 2.0**60, "huge": 1.5e300, "tiny": 5e-324}
    src = tree(tmp_path / "src", {"a": b"a"})
    pack(src, tmp_path / "rp.rpt", config=config)
    manifest = restorepoint.verify(str(tmp_path / "rp.rpt")).manifest
    assert manifest.config == config
    assert manifest.config_identity == restorepoint.config_identity(config)


@pytest.mark.parametrize("options", [{"rp_id": "XYZ"}, {"created": "yesterday"}, {"cache_root": 5}])
def test_head_fields_a_reader_would_refuse(
    tmp_path: Path, previous: tuple[Path, bytes], options: dict[str, Any]
) -> None:
    dest, before = previous
    src = tree(tmp_path / "src", {"a": b"a"})
    with pytest.raises(UsageError):
        pack(src, dest, **options)
    assert_untouched(dest, before)


@pytest.mark.parametrize(
    "options",
    [
        {"position": -1},
        {"position": True},
        {"position": "7"},
        {"chunk_size": 65536.0},
        {"config": [1, 2]},
        {"config": "ab"},
        {"trainer": ["t"]},
        {"trainer": ["", "1"]},
        {"rp_id": "XYZ"},
        {"created": "yesterday"},
        {"cache_root": 5},
    ],
)
def test_invalid_options_are_usage_errors_before_anything_is_written(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    options.setdefault("position", 1)
    with pytest.raises(UsageError):
        pack(src, tmp_path / "out" / "rp.rpt", **options)
    assert not (tmp_path / "out").exists()


def test_trainer_may_be_any_pair(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"a": b"a"})
    result = pack(src, tmp_path / "rp.rpt", position=1, trainer=["t", "1"])
    assert result.manifest.trainer is not None
    assert (result.manifest.trainer.name, result.manifest.trainer.version) == ("t", "1")


def test_the_level_is_checked_before_the_source(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="zstd level"):
        pack(tmp_path / "missing", tmp_path / "rp.rpt", level=99)


def test_callbacks_see_every_byte(tmp_path: Path) -> None:
    src = tree(tmp_path / "src", {"a": os.urandom(2 * CHUNK + 1), "b": b"", "c": b"c" * 10})
    totals: list[int] = []
    seen: list[int] = []
    result = pack(src, tmp_path / "rp.rpt", on_start=totals.append, progress=seen.append)
    assert totals == [2 * CHUNK + 11]
    assert sum(seen) == result.bytes == 2 * CHUNK + 11
    assert max(seen) == CHUNK
