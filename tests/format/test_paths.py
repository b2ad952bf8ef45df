"""Payload path rules: check_path for one path, check_paths for a whole payload table."""

from __future__ import annotations

import time

import pytest

from restorepoint import LimitExceeded, MalformedManifest, UnsafePath
from restorepoint.format import check_path, check_paths, fold


@pytest.mark.parametrize(
    "path",
    [
        "model.pt",
        "a/b/c.txt",
        "optimizer/state_0.pt",
        ".hidden",
        "..foo",
        "a..b",
        "a/.b/c",
        "with space",
        "dash-and_underscore",
        "ünïcödé/文件.bin",
        "emoji-😀",
        "x" * 255,
        "/".join(["d"] * 128),  # MAX_PATH_DEPTH components
        "/".join(["d" * 31] * 128),  # and 4095 bytes
        "C",
        "1:2",
        "ab:c",
    ],
)
def test_ordinary_names_are_accepted(path: str) -> None:
    assert check_path(path) == path
    check_paths([path])


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("/", "absolute"),
        ("..", "'..'"),
        ("../x", "'..'"),
        ("a/../b", "'..'"),
        ("a/..", "'..'"),
        (".", "'.'"),
        ("./a", "'.'"),
        ("a/./b", "'.'"),
        ("a//b", "empty component"),
        ("a/", "empty component"),
        ("a\\b", "backslash"),
        ("..\\x", "backslash"),
        ("C:x", "drive"),
        ("c:/x", "drive"),
        ("a:b", "drive"),
        ("a\x00b", "NUL"),
        ("\x00", "NUL"),
        ("a\x01b", "control"),
        ("a\nb", "control"),
        ("tab\t", "control"),
        ("del\x7f", "control"),
        ("\x1b[31mred", "control"),
        ("\ud800", "not valid Unicode"),
        ("a/\udcff", "not valid Unicode"),
    ],
)
def test_each_rule_refuses(path: str, why: str) -> None:
    with pytest.raises(UnsafePath, match=why) as info:
        check_path(path)
    assert isinstance(info.value, MalformedManifest)
    # the message shows the path escaped: no raw control character reaches a terminal
    assert str(info.value).isprintable()
    with pytest.raises(UnsafePath):
        check_paths([path])


@pytest.mark.parametrize(
    "path",
    [
        "x" * 256,
        "a/" + "é" * 128,  # 256 bytes in one component
        "/".join(["d"] * 2049),  # 4097 bytes
        "é" * 2049,
        "/".join(["d"] * 129),  # one component more than MAX_PATH_DEPTH
        "/".join(["d"] * 2048),  # 4095 bytes, but 2048 components
    ],
)
def test_lengths_are_limits(path: str) -> None:
    with pytest.raises(LimitExceeded):
        check_path(path)
    with pytest.raises(LimitExceeded):
        check_paths([path])


def test_checking_deep_paths_costs_what_shallow_ones_of_the_same_length_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each path's parents used to be joined and looked up one by one: the square of its
    # depth, 35 ms an entry at 2,000 components (and import checks twice). With the depth
    # limit lifted, 2,000 components cost about what 16 components of the same total length
    # do. A generous bound on a ratio of CPU times, each the best of three: the old check
    # came out several hundred times dearer.
    monkeypatch.setattr("restorepoint.format.paths.MAX_PATH_DEPTH", 4096)
    deep = sorted("/".join(["d"] * 2000) + f"/f{i:05d}" for i in range(200))
    length = len(deep[0])
    shallow = sorted(
        ("x" * 250 + "/") * 15 + "y" * (length - 3771) + f"{i:06d}" for i in range(200)
    )
    assert {len(p) for p in deep} == {len(p) for p in shallow} == {length}

    def cost(paths: list[str]) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            check_paths(paths)
            best = min(best, time.process_time() - started)
        return best

    assert cost(deep) < 10 * cost(shallow)


@pytest.mark.parametrize(
    ("path", "error"),
    [
        # rule 8 reports the first bad component, whichever rule it breaks
        ("x" * 256 + "/../y", LimitExceeded),
        ("a/../" + "x" * 256, UnsafePath),
        ("a/" + "é" * 128 + "/./b", LimitExceeded),  # 128 characters, 256 bytes
        ("a/" + "é" * 127 + "/b", None),  # 254 bytes
        ("a/.../b", None),
        ("a/b.", None),
    ],
)
def test_the_first_bad_component_decides(path: str, error: type[Exception] | None) -> None:
    if error is None:
        assert check_path(path) == path
    else:
        with pytest.raises(error):
            check_path(path)


def test_not_a_string_is_refused() -> None:
    with pytest.raises(UnsafePath):
        check_path(None)  # type: ignore[arg-type]
    with pytest.raises(UnsafePath):
        check_path(b"model.pt")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "paths",
    [
        [],
        ["a"],
        ["a", "b", "c/d", "c/e"],
        ["A", "B", "a0"],
        ["a-b", "a/b", "a0"],  # "-" < "/" < "0" in UTF-8 byte order
        ["ab", "a\u00e9", "b"],
        # UTF-8 byte order is code point order, not UTF-16 order
        ["\uff01", "\U0001f600"],
        ["dir/a", "dir/b", "dirx"],
        ["a.b", "a/b"],
    ],
)
def test_sorted_distinct_tables_are_accepted(paths: list[str]) -> None:
    check_paths(paths)
    check_paths(iter(paths))


@pytest.mark.parametrize(
    ("paths", "why"),
    [
        (["b", "a"], "not in sorted order"),
        (["a/b", "a-b"], "not in sorted order"),
        (["\U0001f600", "\uff01"], "not in sorted order"),
        (["a", "a"], "duplicate"),
        (["x/y", "x/y"], "duplicate"),
        (["Model.pt", "model.pt"], "collide"),
        (["README", "readme"], "collide"),
        (["strasse", "stra\u00dfe"], "collide"),  # ß folds to ss
        (["file", "\ufb01le"], "collide"),  # the fi ligature is NFKC "fi"
        (["a", "\uff41"], "collide"),  # fullwidth a
        (["k", "\u212a"], "collide"),  # Kelvin sign
        (["e\u0301", "\u00e9"], "collide"),  # decomposed and precomposed é
        (["a", "a/b"], "both a file and a directory"),
        (["a", "a/b/c"], "both a file and a directory"),
        (["A", "a/b"], "both a file and a directory"),
        (["d/x", "d/x/y"], "both a file and a directory"),
        (["ok", "../bad"], "not in sorted order|'..'"),
        (["ok", "p/../q"], "'..'"),
    ],
)
def test_tables_that_are_refused(paths: list[str], why: str) -> None:
    if why == "collide":
        # sorted, so that the collision and not the order is what is refused
        assert paths == sorted(paths, key=str.encode)
    with pytest.raises(UnsafePath, match=why):
        check_paths(paths)


def test_collisions_are_found_whatever_the_distance() -> None:
    paths = ["A.bin", *(f"m{i:03d}" for i in range(200)), "a.bin"]
    paths.sort(key=str.encode)
    with pytest.raises(UnsafePath, match="collide"):
        check_paths(paths)


def test_fold() -> None:
    assert fold("Model.PT") == "model.pt"
    assert fold("\ufb01") == "fi"
    assert fold("Stra\u00dfe") == "strasse"
    assert fold("\u212a") == fold("K") == "k"
    assert fold("e\u0301") == fold("\u00e9")
    assert fold("a/b") == "a/b"
