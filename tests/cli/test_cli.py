"""The CLI as a user meets it: real subprocesses, exit codes, one stderr line, --json shapes."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli, one_error_line

import restorepoint


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "model.bin").write_bytes(os.urandom(200_000))
    (src / "sub" / "state.json").write_text('{"step": 7}')
    return src


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text("lr: 0.001\nmodel:\n  width: 64\ntrain:\n  checkpoint_every: 500\n")
    return path


def test_version() -> None:
    proc = cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"restorepoint {restorepoint.__version__}"


def test_pack_verify_inspect_json(source: Path, config_file: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "x.rp"
    proc = cli(
        "pack", str(source), str(dest), "--step", "7", "--epoch", "1", "--batch", "2",
        "--trainer", "t=1.0", "--config", str(config_file),
        "--operational", "train.checkpoint_every",
        "--key", "dataset=abc", "--term", "cuda=12.4", "--cache-root", "/cache", "--json",
        "--object-sha256",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = json.loads(proc.stdout)
    keys = {"ok", "url", "id", "size", "digest", "sha256", "files", "bytes", "seconds"}
    assert set(out) == keys | {"position"}
    assert out["ok"] is True and out["files"] == 2 and out["url"] == str(dest)
    assert out["sha256"] == hashlib.sha256(dest.read_bytes()).hexdigest()
    assert out["size"] == dest.stat().st_size
    assert out["position"] == {"step": 7, "epoch": 1, "batch": 2}

    proc = cli("verify", str(dest), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["id"] == out["id"] and report["bytes"] == out["bytes"]
    assert report["digest"] == out["digest"]

    proc = cli("inspect", str(dest), "--json")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)["manifest"]
    assert manifest["trainer"] == {"name": "t", "version": "1.0"}
    assert manifest["config"]["train"] == {"checkpoint_every": 500}
    assert manifest["operational_keys"] == ["train.checkpoint_every"]
    assert manifest["cache_keys"] == {"dataset": "abc"} and manifest["terms"] == {"cuda": "12.4"}
    assert [e["path"] for e in manifest["payload"]] == ["model.bin", "sub/state.json"]

    proc = cli("inspect", str(dest), "--head", "--json")
    head = json.loads(proc.stdout)["manifest"]
    assert "payload" not in head and head["position"] == manifest["position"]


def test_human_output(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "x.rp"
    proc = cli("pack", str(source), str(dest), "--step", "3")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.splitlines()[-1] == str(dest)
    proc = cli("verify", str(dest))
    assert proc.returncode == 0 and proc.stdout.startswith("ok: 2 files")
    proc = cli("inspect", str(dest))
    assert "step 3" in proc.stdout and "model.bin" in proc.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["pack", "SRC", "DEST"], "--step"),
        (["pack", "SRC", "DEST", "--step", "-1"], "--step"),
        (["pack", "SRC", "DEST", "--step", "1", "--batch", "2"], "--batch needs --epoch"),
        (["pack", "SRC", "DEST", "--step", "1", "--key", "nokey"], "KEY=VALUE"),
        (["pack", "SRC", "DEST", "--step", "1", "--term", "a=1", "--term", "a=2"], "twice"),
        (["pack", "SRC", "DEST", "--step", "1", "--trainer", "noversion"], "NAME=VERSION"),
        (["pack", "SRC", "DEST", "--step", "1", "--level", "99"], "--level"),
        (["pack", "SRC", "DEST", "--step", "1", "--operational", "a..b"], "empty path segment"),
        (["verify", "DEST", "--no-such-option"], "no-such-option"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    args: list[str], needle: str, source: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "x.rp"
    args = [str(source) if a == "SRC" else str(dest) if a == "DEST" else a for a in args]
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert needle in one_error_line(proc)
    assert not dest.exists()


def test_bad_config_names_the_key(source: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: 0.1\nstarted: 2026-01-01\n")
    proc = cli("pack", str(source), str(tmp_path / "x.rp"), "--step", "1", "--config", str(bad))
    assert proc.returncode == 2
    assert "started" in one_error_line(proc)
    assert not (tmp_path / "x.rp").exists()


def test_not_found_is_exit_4(tmp_path: Path) -> None:
    proc = cli("verify", str(tmp_path / "missing.rp"), "--json")
    assert proc.returncode == 4
    assert "not found" in one_error_line(proc)
    err = json.loads(proc.stdout)
    assert err == {
        "ok": False,
        "error": {
            "class": "NotFound",
            "exit_code": 4,
            "message": f"{tmp_path / 'missing.rp'}: not found",
            "url": str(tmp_path / "missing.rp"),
        },
    }
    proc = cli("pack", str(tmp_path / "nope"), str(tmp_path / "x.rp"), "--step", "1")
    assert proc.returncode == 4 and "source not found" in one_error_line(proc)


def test_integrity_failure_is_exit_1_and_names_the_file(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "x.rp"
    assert cli("pack", str(source), str(dest), "--step", "1", "--level", "0").returncode == 0
    data = bytearray(dest.read_bytes())
    data[1000] ^= 0x55  # inside model.bin's stored bytes (store-only, first entry)
    dest.write_bytes(bytes(data))
    proc = cli("verify", str(dest), "--json")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "model.bin" in line and "digest differs" in line
    assert json.loads(proc.stdout)["error"]["class"] == "DigestMismatch"


def test_missing_extra_is_one_line_hint(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['s3fs'] = None\n"
        "from restorepoint._cli import main\n"
        "main(['verify', 's3://bucket/x.rp'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2
    assert "pip install 'restorepoint[s3]'" in one_error_line(proc)


def test_no_progress_bar_when_not_a_terminal(source: Path, tmp_path: Path) -> None:
    proc = cli("pack", str(source), str(tmp_path / "x.rp"), "--step", "1")
    assert proc.returncode == 0 and proc.stderr == ""


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


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    src = tmp_path / "big"
    src.mkdir()
    for i in range(8):
        (src / f"f{i}.bin").write_bytes(os.urandom(8 << 20))
    dest = tmp_path / "x.rp"
    code, output = _run_on_terminal(["pack", str(src), str(dest), "--step", "1"])
    assert code == 0, output
    # The bar counts in MiB as the summary line does ("packed 8 files, 64.0 MiB -> ..."),
    # never in rich's own MB.
    assert b"packing" in output and b"/64.0 MiB" in output and b"MB" not in output
    assert b"packed 8 files, 64.0 MiB -> " in output
    code, output = _run_on_terminal(["verify", str(dest)])
    assert code == 0, output
    assert b"verifying" in output
    code, output = _run_on_terminal(["verify", str(dest), "--json"])
    assert code == 0 and b"verifying" not in output


def test_sigterm_during_pack_publishes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "big"
    src.mkdir()
    for i in range(16):
        (src / f"f{i}.bin").write_bytes(os.urandom(8 << 20))
    dest = tmp_path / "x.rp"
    dest.write_bytes(b"previous")
    proc = subprocess.Popen(
        [sys.executable, "-m", "restorepoint", "pack", str(src), str(dest), "--step", "1",
         "--level", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )  # fmt: skip
    # Wait until the packer has started writing (its partial file appears), then terminate it.
    # (Python's start-up alone can take seconds on a loaded machine: wait up to a minute.)
    for _ in range(6000):
        if any(".rp-partial-" in p.name for p in tmp_path.iterdir()):
            break
        if proc.poll() is not None:
            break
        select.select([], [], [], 0.01)
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # Seen once under a loaded suite, never since (60 runs under 3 busy loops): where
        # it hangs, SIGABRT has faulthandler print every thread's stack into the failure.
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the pack did not end within 60 s of SIGTERM:\n{err}")
    if proc.returncode == 0:
        pytest.skip("the pack finished before the signal arrived")
    assert proc.returncode == 143
    assert "terminated" in err and "Traceback" not in err
    assert dest.read_bytes() == b"previous"
    assert not [p for p in tmp_path.iterdir() if ".rp-partial-" in p.name]


@pytest.mark.parametrize(
    "args",
    [["verify"], ["inspect"], ["inspect", "--head"], ["check", "--term", "torch=2"], ["import"]],
    ids=lambda a: " ".join(a),
)
def test_a_url_that_is_not_a_regular_file_is_exit_4_at_once(
    tmp_path: Path, args: list[str]
) -> None:
    # A FIFO used to hang the reader in open() until some writer came along: the type is
    # now checked on a descriptor opened without waiting. Nothing writes to it here, so an
    # open that waits runs into the timeout.
    fifo = tmp_path / "pipe.rp"
    os.mkfifo(fifo)
    verb, *options = args
    dest = [str(tmp_path / "dest")] if verb == "import" else []
    proc = cli(verb, str(fifo), *dest, *options, "--json", timeout=30)
    assert proc.returncode == 4
    assert one_error_line(proc) == f"restorepoint: error: {fifo}: not a regular file"
    assert json.loads(proc.stdout)["error"]["class"] == "StorageError"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.rp"]
    for other in (tmp_path, Path(os.devnull)):  # a directory, a character device
        proc = cli(verb, str(other), *dest, *options, timeout=30)
        assert proc.returncode == 4
        assert one_error_line(proc).endswith(": not a regular file")


@pytest.mark.parametrize(
    ("option", "exit_code", "message"),
    [
        ("config", 2, "cannot read the config file (not a regular file)"),
        ("sign", 2, "cannot read the key file (not a regular file)"),
        ("trust", 2, "cannot read the key file (not a regular file)"),
        ("identity", 2, "cannot read the key file (not a regular file)"),
        ("profile", 2, "cannot be read (not a regular file)"),
    ],
)
def test_an_option_file_that_is_a_fifo_is_refused_at_once(
    tmp_path: Path, option: str, exit_code: int, message: str
) -> None:
    """Every file an option names is read without waiting: a FIFO there (nothing ever writes
    to it) is one line and an exit code, never a hang until the timeout."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "w.bin").write_bytes(b"w" * 1000)
    packed = tmp_path / "a.rp"
    assert cli("pack", str(source), str(packed), "--step", "1").returncode == 0
    args = {
        "config": ["pack", str(source), str(tmp_path / "b.rp"), "--config", str(fifo)],
        "sign": ["pack", str(source), str(tmp_path / "b.rp"), "--step", "1", "--sign", str(fifo)],
        "trust": ["verify", str(packed), "--trust", str(fifo)],
        "identity": ["import", str(packed), str(tmp_path / "dest"), "--identity", str(fifo)],
        "profile": [
            "pack", str(source), str(tmp_path / "b.rp"), "--adapter", "external",
            "--adapter-option", f"profile={fifo}",
        ],
    }[option]  # fmt: skip
    proc = cli(*args, timeout=30)
    assert proc.returncode == exit_code, proc.stderr
    assert message in one_error_line(proc)
    assert not (tmp_path / "b.rp").exists() and not (tmp_path / "dest").exists()
