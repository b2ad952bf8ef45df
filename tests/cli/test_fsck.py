"""restorepoint fsck as a user meets it: exit codes, the table, --json, --repair, escaping,
a store that cannot be read, and memory on a store of 100k objects. Real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, cli_measured, one_error_line

from tests.ops.test_fsck import seed_local
from tests.ops.test_store import DEAD_PID, partial, publish, put

FINDING_KEYS = {"detail", "error", "kind", "name", "pending", "removable", "url"}
REPORT_KEYS = {
    "clean",
    "counts",
    "defects",
    "findings",
    "grace_s",
    "objects",
    "ok",
    "pending",
    "read_data",
    "repaired",
    "restore_points",
    "store",
}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(3000))
    return src


def check_schema(data: dict[str, Any]) -> None:
    assert set(data) == REPORT_KEYS
    assert set(data["counts"]) == {
        "damaged",
        "missing_part",
        "dangling_reference",
        "orphan_part",
        "leftover",
        "upload",
        "stray",
    }
    assert set(data["restore_points"]) == {"checked", "damaged", "sound"}
    assert all(set(f) == FINDING_KEYS for f in data["findings"])
    assert data["defects"] == sum(data["counts"].values()) - len(
        [f for f in data["findings"] if not f["pending"] and f["url"] in (data["repaired"] or [])]
    )
    assert data["ok"] is data["clean"] is (data["defects"] == 0)


def test_a_seeded_store_exit_codes_table_json_and_repair(source: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    seeded = seed_local(store, source, tmp_path)
    proc = cli("fsck", str(store))
    assert proc.returncode == 1
    assert one_error_line(proc) == f"restorepoint: error: the store holds 5 defects: {store}/"
    lines = proc.stdout.splitlines()
    for kind, name in [
        ("damaged", seeded["truncated"]),
        ("missing part", seeded["commit"]),
        ("orphan part", seeded["orphan"]),
        ("leftover", seeded["leftover"]),
        ("stray", seeded["stray"]),
    ]:
        assert any(line.startswith(f"defect    {kind:<12}  {store}/{name}  (") for line in lines)
    assert any(
        line.startswith(f"pending   leftover      {store}/{seeded['young']}") for line in lines
    )
    assert not any(seeded["flipped"] in line for line in lines)
    table = lines[lines.index("found              count") :]
    assert table == [
        "found              count",
        "restore points         4  (2 sound)",
        "damaged                1",
        "missing part           1",
        "dangling ref           0",
        "orphan part            1",
        "leftover               1",
        "open upload            0",
        "stray                  1",
        "pending                1  (younger than --grace: not defects)",
    ]

    proc = cli("fsck", str(store), "--read-data", "--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    check_schema(data)
    assert data["counts"]["damaged"] == 2 and data["defects"] == 6 and data["read_data"]
    (flip,) = [f for f in data["findings"] if f["name"] == seeded["flipped"]]
    assert (flip["kind"], flip["error"], flip["removable"]) == ("damaged", "DigestMismatch", False)

    proc = cli("fsck", str(store), "--read-data", "--repair", "--json")
    assert proc.returncode == 1  # what it must not remove is still there
    data = json.loads(proc.stdout)
    check_schema(data)
    assert sorted(data["repaired"]) == sorted(
        [f"{store}/{seeded['orphan']}", f"{store}/{seeded['leftover']}"]
    )
    assert data["defects"] == 4
    assert Path(f"{store}/{seeded['flipped']}").exists()

    proc = cli("fsck", str(store), "--read-data", "--repair")
    assert proc.returncode == 1
    assert f"{'repaired':<16}{0:>8}" in proc.stdout.splitlines()
    # Once only what must stay is left, a grace of 0 makes the young leftover go too.
    proc = cli("fsck", str(store), "--repair", "--grace", "0s")
    assert f"repaired  leftover      {store}/{seeded['young']}" in proc.stdout
    for rel in ("flipped", "truncated", "commit"):
        shutil.rmtree(store / seeded[rel], ignore_errors=True)
        (store / seeded[rel]).unlink(missing_ok=True)
    shutil.rmtree(store / f"{seeded['commit'].removesuffix('.rp')}.parts")
    (store / seeded["stray"]).unlink()
    proc = cli("fsck", str(store), "--read-data")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "clean: 1 restore point, 1 object listed"
    assert proc.stderr == ""


def test_usage_and_storage_failures(tmp_path: Path, s3_env: dict[str, str]) -> None:
    proc = cli("fsck", str(tmp_path), "--grace", "soon")
    assert proc.returncode == 2 and "not a duration" in one_error_line(proc)
    proc = cli("fsck", "s3://no-such-bucket-for-fsck/store/", "--json", env=s3_env)
    assert proc.returncode == 4
    assert "not found" in one_error_line(proc)
    assert json.loads(proc.stdout)["error"]["exit_code"] == 4
    proc = cli("fsck", str(tmp_path / "empty"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["clean"] is True


def test_names_from_the_store_are_printed_escaped(source: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    publish(source, store, "a", 1)
    put(store / "a" / "evil\x1b]0;owned\x07\u202e.txt", time.time())
    proc = cli("fsck", str(store))
    assert proc.returncode == 1
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout and "\u202e" not in proc.stdout
    assert "evil\\x1b]0;owned\\x07\\u202e.txt" in proc.stdout
    data = json.loads(cli("fsck", str(store), "--json").stdout)
    assert data["findings"][0]["name"] == "a/evil\x1b]0;owned\x07\u202e.txt"


#: Objects in the big store, and how many of them are restore points (hard links to one, each
#: under another step's name: every head is read, each one fails its name check).
BIG = 100_000
RESTORE_POINTS = 2_000
#: Peak RSS of the CLI for fsck of the 100k-object store. Measured at about 125 MiB (fsck of an
#: empty store: about 47 MiB): the listing's names and one record per finding, under 1 KiB an
#: object. Heads or indexes kept per restore point, or the listing copied per restore point,
#: would go past it.
RSS_LIMIT = 256 * 2**20


def test_memory_on_a_store_of_100k_objects(source: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    rp = publish(source, store, "r", 1)
    first = Path(rp.url)
    stem = first.name.split("-", 1)[1]
    for step in range(2, RESTORE_POINTS + 1):
        os.link(first, store / "r" / f"{step:016d}-{stem}")
    rest = BIG - RESTORE_POINTS
    for i in range(rest):
        group = store / f"g{i % 100:02d}"
        if i < 100:
            group.mkdir()
        kind = i % 3
        if kind == 0:
            name = f"stray-{i}.bin"
        elif kind == 1:
            name = partial(f"{i}.rp", DEAD_PID, f"{i:012x}")
        else:
            name = f"0000000000000009-20260101T000000000Z-{i:012x}.parts/rank-00000.rp"
            (group / name).parent.mkdir()
        (group / name).write_bytes(b"x")
    measured = cli_measured("fsck", str(store), timeout=600)
    proc = measured.proc
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert f"{'restore points':<16}{RESTORE_POINTS:>8}  (1 sound)" in lines
    assert f"{'damaged':<16}{RESTORE_POINTS - 1:>8}" in lines
    assert f"{'stray':<16}{(rest + 2) // 3:>8}" in lines
    assert (
        f"{'pending':<16}{rest - (rest + 2) // 3:>8}  (younger than --grace: not defects)" in lines
    )
    assert measured.max_rss < RSS_LIMIT, measured.max_rss
