"""`restorepoint import URL DEST` as a user meets it: the summary, the --json shape, exit codes
with one stderr line, --force, and the progress bar on a terminal."""

from __future__ import annotations

import json
import os
import pty
import resource
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli, one_error_line

import restorepoint
from restorepoint.format.limits import MAX_PATH_DEPTH
from restorepoint.testing.forge import Parts, assemble

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


def test_leftover_names_with_impossible_pids_never_stop_an_import(packed: str, out: Path) -> None:
    # Names beside DEST are anyone's who can write to its parent. A PID beyond any pid_t made
    # os.kill raise OverflowError, and "²" (which str.isdigit accepts) made int() raise
    # ValueError: every import into DEST crashed with exit 70. Now a decimal PID that no
    # process can have is a dead importer's, a PID that is not decimal is nobody's (kept until
    # it is a day old, like any leftover of another host), and the import goes on.
    host = socket.gethostname().replace("/", "_") or "host"
    dead = [f".ckpt.rp-import-{host}-{pid}-0123456789ab" for pid in ("99999999999999999999", "0")]
    dead.append(f".ckpt.rp-old-{host}-4294967296-0123456789ab")
    unknown = [f".ckpt.rp-import-{host}-\u00b2-0123456789ab", f".ckpt.rp-old-{host}--0123456789ab"]
    others = [".ckpt.rp-import-elsewhere-99999999999999999999-0123456789ab", ".ckpt.rp-importer"]
    for name in dead + unknown + others:
        (out / name).mkdir()
        (out / name / "junk").write_bytes(b"x")
    stale = out / f".ckpt.rp-import-{host}-\u00b3-0123456789ab"
    stale.mkdir()
    os.utime(stale, (1_000_000, 1_000_000))
    proc = cli("import", packed, str(out / "ckpt"))
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr
    assert files_of(out / "ckpt") == FILES
    assert sorted(os.listdir(out)) == sorted(["ckpt", *unknown, *others])


def forge_payload(path: Path, paths: list[str]) -> str:
    """A restore point holding one small file at each of ``paths`` (every digest valid)."""
    parts = Parts.sample(files={p: p.encode()[-40:] for p in paths})
    path.write_bytes(assemble(parts))
    return str(path)


def test_verify_and_import_agree_on_deep_paths(tmp_path: Path, out: Path) -> None:
    # A path 2,000 directories deep passed verify, then crashed import with a RecursionError
    # (exit 70). Now a path has at most MAX_PATH_DEPTH (128) components, for the reader and
    # the unpacker alike: what verify accepts, import unpacks, and what it refuses, both do.
    at_limit = "/".join(["d"] * (MAX_PATH_DEPTH - 1))
    ok = forge_payload(tmp_path / "deep.rp", [f"{at_limit}/a", f"{at_limit}/b", "top"])
    assert cli("verify", ok).returncode == 0
    proc = cli("import", ok, str(out / "deep"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(files_of(out / "deep")) == [f"{at_limit}/a", f"{at_limit}/b", "top"]
    for depth in (MAX_PATH_DEPTH + 1, 2000):
        too_deep = "/".join(["d"] * depth)
        bad = forge_payload(tmp_path / f"deeper-{depth}.rp", [too_deep, "top"])
        for args in (("verify", bad), ("import", bad, str(out / "deeper"))):
            proc = cli(*args, "--json")
            assert proc.returncode == 1, proc.stderr
            assert f"more than {MAX_PATH_DEPTH} components" in one_error_line(proc)
            assert json.loads(proc.stdout)["error"]["class"] == "LimitExceeded"
    assert sorted(os.listdir(out)) == ["deep"]


def test_pack_refuses_a_source_deeper_than_the_limit(tmp_path: Path) -> None:
    source = tmp_path / "src"
    deep = source.joinpath(*["d"] * MAX_PATH_DEPTH)
    deep.mkdir(parents=True)
    (deep / "x").write_bytes(b"x")
    proc = cli("pack", str(source), str(tmp_path / "x.rp"), "--step", "1")
    assert proc.returncode == 2
    assert f"more than {MAX_PATH_DEPTH} components" in one_error_line(proc)
    assert not (tmp_path / "x.rp").exists()


def test_import_holds_one_descriptor_per_level_not_per_directory(tmp_path: Path, out: Path) -> None:
    # The unpacker kept a descriptor open for every directory it made: a payload of 1,000
    # directories needed 1,000 of them (EMFILE, exit 4, under a limit of 256). Now only the
    # directories from the root to the file being written are open, so a payload as deep as
    # the limit allows, and as wide as one likes, imports under a low descriptor limit.
    at_limit = "/".join(["d"] * (MAX_PATH_DEPTH - 1))
    paths = sorted([*(f"w{i:04d}/f" for i in range(1000)), f"{at_limit}/f"])
    url = forge_payload(tmp_path / "wide.rp", paths)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = min(256, hard) if hard != resource.RLIM_INFINITY else 256

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    proc = subprocess.run(
        [sys.executable, "-m", "restorepoint", "import", url, str(out / "wide")],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=low_limit,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(files_of(out / "wide")) == paths
