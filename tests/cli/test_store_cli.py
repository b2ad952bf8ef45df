"""The store verbs as a user meets them: list, latest, prune, pack into a store, and --latest
on the reading verbs. Real subprocesses; the stores are made with the library."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from clirun import cli, one_error_line

import restorepoint
from restorepoint._cli.import_ import HEAD_ONLY
from restorepoint.format import read_head
from restorepoint.storage import resolve

CHUNK = 65536


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(5000))
    (src / "state.json").write_text('{"step": 1}')
    return src


def publish(
    source: Path, store: Path, run: str, step: int, minute: int = 0
) -> restorepoint.PackResult:
    return restorepoint.pack(
        source, f"{store}/", position=step, run=run, chunk_size=CHUNK, level=0,
        trainer=("t", "1.0"), created=f"2026-01-01T00:{minute:02d}:00.000Z",
        incremental=False,  # the rules over full restore points (chains: test_delta.py)
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path, source: Path) -> tuple[Path, dict[str, list[str]]]:
    """Run a at steps 1, 2, 3 and run b at step 10: their URLs, oldest first."""
    root = tmp_path / "store"
    urls = {
        "a": [publish(source, root, "a", s, minute=s).url for s in (1, 2, 3)],
        "b": [publish(source, root, "b", 10).url],
    }
    return root, urls


def corrupt(url: str) -> None:
    reader = resolve(url).reader()
    try:
        offset = read_head(reader).data_start + 4
    finally:
        reader.close()
    data = bytearray(Path(url).read_bytes())
    data[offset] ^= 0xFF
    Path(url).write_bytes(bytes(data))


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


# -- list ------------------------------------------------------------------------------------


def test_list_human_and_json(store: tuple[Path, dict[str, list[str]]]) -> None:
    root, urls = store
    proc = cli("list", str(root))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4
    listed = [line.split()[-1] for line in lines]
    assert sorted(listed) == sorted(urls["a"] + urls["b"])
    a_lines = [line for line in lines if line.startswith("a ")]
    assert [line.split()[-1] for line in a_lines] == urls["a"][::-1]  # newest first
    assert "step          3" in a_lines[0] and "2026-01-01T00:03:00.000Z" in a_lines[0]

    proc = cli("list", str(root), "--json", "--run", "a")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["store"] == str(root)
    points = out["restore_points"]
    assert [p["url"] for p in points] == urls["a"][::-1]
    assert set(points[0]) == {"created", "name", "run", "size", "step", "url"}
    assert points[0]["step"] == 3 and points[0]["run"] == "a"
    assert points[0]["size"] == Path(urls["a"][2]).stat().st_size

    proc = cli("list", str(root / "missing"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["restore_points"] == []
    proc = cli("list", str(root), "--run", "bad/run")
    assert proc.returncode == 2
    assert "not a run id" in one_error_line(proc)


# -- latest ----------------------------------------------------------------------------------


def test_latest(source: Path, store: tuple[Path, dict[str, list[str]]]) -> None:
    root, urls = store
    proc = cli("latest", str(root), "--run", "a")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == urls["a"][2] + "\n"

    proc = cli("latest", str(root))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "a, b" in line and "--run" in line
    assert proc.stdout == ""

    corrupt(urls["a"][2])
    proc = cli("latest", str(root), "--run", "a")
    assert proc.stdout.strip() == urls["a"][2]
    proc = cli("latest", str(root), "--run", "a", "--verify", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["url"] == urls["a"][1] and out["step"] == 2

    single = root.parent / "single"
    only = publish(source, single, "x", 4)
    proc = cli("latest", str(single))
    assert proc.returncode == 0 and proc.stdout.strip() == only.url

    proc = cli("latest", str(root.parent / "empty"), "--json")
    assert proc.returncode == 4
    assert "no restore point" in one_error_line(proc)
    assert json.loads(proc.stdout)["error"]["class"] == "NotFound"


# -- prune -----------------------------------------------------------------------------------


def test_prune_dry_run_then_json(store: tuple[Path, dict[str, list[str]]]) -> None:
    root, urls = store
    before = files(root)
    proc = cli("prune", str(root), "--keep-last", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert files(root) == before
    lines = proc.stdout.splitlines()
    assert lines == [
        f"keep    {urls['a'][2]}  (newest; newest that verifies; keep-last 1)",
        f"delete {urls['a'][0]}",
        f"delete {urls['a'][1]}",
        f"keep    {urls['b'][0]}  (newest; newest that verifies; keep-last 1)",
        "would delete 2 restore points and 0 leftovers",
    ]

    proc = cli("prune", str(root), "--keep-last", "1", "--keep-every", "2", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["dry_run"] is True and plan["deleted"] == []
    a = plan["runs"][0]
    assert a["run"] == "a"
    assert [(k["step"], k["reasons"]) for k in a["keep"]] == [
        (3, ["newest", "newest that verifies", "keep-last 1", "keep-every 2"]),
        (1, ["keep-every 2"]),
    ]
    assert [d["url"] for d in a["delete"]] == [urls["a"][1]]

    proc = cli("prune", str(root), "--keep-last", "1", "--run", "a", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["deleted"] == urls["a"][:2] and [r["run"] for r in out["runs"]] == ["a"]
    assert files(root) == {u[len(str(root)) + 1 :] for u in (urls["a"][2], urls["b"][0])}


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--keep-within", "soon"],
        ["--keep-last", "0"],
        ["--keep-last", "1", "--grace", "a while"],
        ["--keep-last", "1", "--run", "-x"],
    ],
)
def test_prune_refusals(store: tuple[Path, dict[str, list[str]]], args: list[str]) -> None:
    root, _ = store
    before = files(root)
    proc = cli("prune", str(root), *args)
    assert proc.returncode == 2
    one_error_line(proc)
    assert files(root) == before


def test_prune_deletes_and_says_so(store: tuple[Path, dict[str, list[str]]]) -> None:
    root, urls = store
    leftover = root / "a" / ".x.rp.rp-partial-99999999-0123456789ab"
    leftover.write_bytes(b"half")
    os.utime(leftover, (1_000_000, 1_000_000))
    proc = cli("prune", str(root), "--keep-last", "2")
    assert proc.returncode == 0, proc.stderr
    assert f"deleted {urls['a'][0]}" in proc.stdout.splitlines()
    assert f"deleted {root}/a/{leftover.name}  (leftover)" in proc.stdout.splitlines()
    assert proc.stdout.splitlines()[-1] == "deleted 1 restore point and 1 leftover"
    assert not leftover.exists() and not Path(urls["a"][0]).exists()


@pytest.mark.parametrize("pid", ["99999999999999999999", "\u00b2", "0", "4294967296"])
def test_prune_takes_a_partial_name_with_an_impossible_pid_for_a_dead_writer(
    store: tuple[Path, dict[str, list[str]]], pid: str
) -> None:
    # A huge PID made os.kill raise OverflowError and "²" made int() raise ValueError: prune
    # crashed (exit 70) on a name anyone with write access to the store can plant. A PID that
    # no process can have names no live writer: the old partial name is a leftover.
    root, urls = store
    leftover = root / "a" / f".x.rp.rp-partial-{pid}-0123456789ab"
    leftover.write_bytes(b"half")
    os.utime(leftover, (1_000_000, 1_000_000))
    young = root / "a" / f".y.rp.rp-partial-{pid}-0123456789ab"
    young.write_bytes(b"half")
    proc = cli("prune", str(root), "--keep-last", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines()[-1] == "deleted 0 restore points and 1 leftover"
    assert not leftover.exists()
    assert young.exists()  # within the grace period, whatever its PID
    assert all(Path(url).exists() for run in urls.values() for url in run)


# -- pack into a store -----------------------------------------------------------------------


def test_pack_into_a_store_with_keep_last(
    source: Path, store: tuple[Path, dict[str, list[str]]]
) -> None:
    root, urls = store
    proc = cli(
        "pack", str(source), f"{root}/", "--step", "4", "--run", "a", "--keep-last", "1", "--full"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    new = restorepoint.latest(str(root), run="a").url
    assert new.startswith(f"{root}/a/0000000000000004-") and new in lines
    assert lines[-4:] == [new, *(f"deleted {u}" for u in urls["a"])]
    assert {e.url for e in restorepoint.list_store(str(root))} == {new, urls["b"][0]}

    proc = cli(
        "pack", str(source), f"{root}/", "--step", "5", "--run", "a", "--keep-last", "1",
        "--json", "--full",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["pruned"] == [new] and out["url"] == restorepoint.latest(str(root), run="a").url


def test_pack_store_refusals(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "x.rp"
    proc = cli("pack", str(source), str(dest), "--step", "1", "--run", "a", "--keep-last", "1")
    assert proc.returncode == 2
    assert "store" in one_error_line(proc)
    assert not (tmp_path / "out").exists()
    proc = cli("pack", str(source), f"{tmp_path}/store/", "--step", "1")
    assert proc.returncode == 2
    assert "run" in one_error_line(proc)
    assert not (tmp_path / "store").exists()


# -- --latest on the reading verbs ----------------------------------------------------------


def test_reading_verbs_take_the_latest(
    store: tuple[Path, dict[str, list[str]]], tmp_path: Path
) -> None:
    root, urls = store
    proc = cli("verify", str(root), "--latest", "--run", "a")
    assert proc.returncode == 0, proc.stderr
    assert "(step 3)" in proc.stdout

    proc = cli("inspect", str(root), "--latest", "--run", "a", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["url"] == urls["a"][2] and out["manifest"]["position"]["step"] == 3

    proc = cli("check", str(root), "--latest", "--run", "b", "--trainer", "t=1.0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{HEAD_ONLY}: step 10 at {urls['b'][0]}"

    dest = tmp_path / "resumed"
    proc = cli("import", str(root), str(dest), "--latest", "--run", "a", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["url"] == urls["a"][2] and out["position"]["step"] == 3
    assert sorted(p.name for p in dest.iterdir()) == ["model.bin", "state.json"]

    # --latest without --run in a store of two runs, and --run without --latest.
    for args in (
        ["verify", str(root), "--latest"],
        ["inspect", urls["a"][0], "--run", "a"],
        ["verify", urls["a"][0], "--run", "a"],
        ["check", urls["a"][0], "--run", "a", "--trainer", "t=1.0"],
        ["import", urls["a"][0], str(tmp_path / "other"), "--run", "a"],
    ):
        proc = cli(*args)
        assert proc.returncode == 2, args
        assert "--run" in one_error_line(proc)
    assert not (tmp_path / "other").exists()


def test_verify_latest_of_a_corrupt_newest_fails(store: tuple[Path, dict[str, list[str]]]) -> None:
    root, urls = store
    corrupt(urls["a"][2])
    proc = cli("verify", str(root), "--latest", "--run", "a")
    assert proc.returncode == 1
    assert urls["a"][2] in one_error_line(proc)
