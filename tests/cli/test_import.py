"""`restorepoint import URL DEST` as a user meets it: the summary, the --json shape, exit codes
with one stderr line, --force, and the progress bar on a terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli, one_error_line

import restorepoint

FILES = {
    "model.bin": bytes(range(256)) * 1000,
    "empty.bin": b"",
    "sub/state.json": b'{"step": 7}',
}


def files_of(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def packed(tmp_path: Path) -> str:
    source = tmp_path / "ckpt"
    for rel, data in FILES.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_bytes(data)
    url = str(tmp_path / "store" / "step-7.rp")
    proc = cli("pack", str(source), url, "--step", "7", "--epoch", "2", "--batch", "5")
    assert proc.returncode == 0, proc.stderr
    return url


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


def test_human_summary(packed: str, out: Path) -> None:
    dest = out / "run"
    proc = cli("import", packed, str(dest))
    assert proc.returncode == 0, proc.stderr
    # A plain import is "give me the files": it says on stderr that nothing was checked.
    assert proc.stderr == (
        "restorepoint: warning: nothing was checked: the import is not gated (give "
        "--check-keys with --adapter, --expect or expected values)\n"
    )
    total = sum(len(v) for v in FILES.values())
    line = proc.stdout.strip()
    assert line.startswith("imported step 7, epoch 2, batch 5: 3 files, ")
    assert f"{total / 1024:.1f} KiB verified into {dest} in " in line
    assert files_of(dest) == FILES


def test_json_shape(packed: str, out: Path) -> None:
    dest = out / "run"
    proc = cli("import", packed, str(dest), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "nothing was checked" in proc.stderr
    data = json.loads(proc.stdout)
    keys = {"ok", "url", "dest", "id", "position", "files", "bytes", "seconds", "gated"}
    assert set(data) == keys
    assert data["gated"] is False
    assert data["ok"] is True and data["url"] == packed and data["dest"] == str(dest)
    assert data["id"] == restorepoint.read_manifest(packed).id
    assert data["position"] == {"step": 7, "epoch": 2, "batch": 5}
    assert sorted(data["files"]) == sorted(str(dest / rel) for rel in FILES)
    assert all(os.path.isfile(p) for p in data["files"])
    assert data["bytes"] == sum(len(v) for v in FILES.values())
    assert isinstance(data["seconds"], float) and data["seconds"] >= 0


def test_non_empty_dest_is_refused_then_force_replaces(packed: str, out: Path) -> None:
    dest = out / "run"
    dest.mkdir()
    (dest / "old.txt").write_bytes(b"old")
    proc = cli("import", packed, str(dest))
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert line.startswith("restorepoint: error: ") and "not empty" in line and "--force" in line
    assert proc.stdout == ""
    assert files_of(dest) == {"old.txt": b"old"}

    proc = cli("import", packed, str(dest), "--json")
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["class"] == "DestinationError"

    proc = cli("import", packed, str(dest), "--force")
    assert proc.returncode == 0, proc.stderr
    assert files_of(dest) == FILES  # old.txt is gone: replaced, not merged
    assert os.listdir(out) == ["run"]


def test_dest_that_is_a_file(packed: str, out: Path) -> None:
    dest = out / "run"
    dest.write_bytes(b"a file")
    proc = cli("import", packed, str(dest), "--force")
    assert proc.returncode == 2
    assert "not a directory" in one_error_line(proc)
    assert dest.read_bytes() == b"a file"


def test_missing_url(tmp_path: Path, out: Path) -> None:
    dest = out / "a" / "run"
    proc = cli("import", str(tmp_path / "nothing.rp"), str(dest))
    assert proc.returncode == 4
    assert "not found" in one_error_line(proc)
    assert os.listdir(out) == []


def test_corrupt_restore_point(packed: str, tmp_path: Path, out: Path) -> None:
    manifest = restorepoint.read_manifest(packed)
    assert manifest.payload is not None
    entry = manifest.payload[0]
    data = bytearray(Path(packed).read_bytes())
    data[entry.offset + entry.stored_size // 2] ^= 0xFF  # inside the first file's stored bytes
    bad = tmp_path / "bad.rp"
    bad.write_bytes(bytes(data))
    dest = out / "run"
    proc = cli("import", str(bad), str(dest), "--json")
    assert proc.returncode == 1
    error = json.loads(proc.stdout)["error"]
    assert error["class"] in {"DigestMismatch", "DecodeError", "FramingError"}
    assert error["exit_code"] == 1
    assert len(proc.stderr.splitlines()) == 1
    assert os.listdir(out) == []  # DEST absent, no staging directory left


def _run_on_terminal(args: list[str]) -> tuple[int, bytes]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; return (exit code, output)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "restorepoint", *args],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "100", "TERM": "xterm"},
    )
    os.close(follower)
    output = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the pty closes when the child exits
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    return proc.wait(timeout=60), output


def test_progress_bar_on_a_terminal(tmp_path: Path, out: Path) -> None:
    src = tmp_path / "big"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.bin").write_bytes(os.urandom(8 << 20))
    url = str(tmp_path / "big.rp")
    proc = cli("pack", str(src), url, "--step", "1", "--level", "0")
    assert proc.returncode == 0, proc.stderr
    code, output = _run_on_terminal(["import", url, str(out / "run")])
    assert code == 0, output
    assert b"importing" in output and b"imported step 1" in output
    code, output = _run_on_terminal(["import", url, str(out / "again"), "--json"])
    assert code == 0, output
    assert b"importing" not in output
