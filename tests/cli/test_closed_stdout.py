"""A closed stdout is a quiet exit, as git's is: ``restorepoint inspect URL | head -1`` exits 0
with nothing on stderr, never "internal error". restorepoint itself ends with 141 (what a shell
reports for a program that SIGPIPE ended) when a write found no reader, or 0 if it had written
everything before the reader left; an error keeps its own exit code and stderr line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli

from restorepoint.ops import pack

CLOSED = 141
#: As a user's shell runs it: stdout to a pipe is block-buffered (PYTHONUNBUFFERED, which a
#: test runner may set, would hide what the interpreter's last flush does).
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local store holding one restore point of 300 files: inspect prints a line for each,
    each written (and flushed) on its own, so that most writes come after ``head`` is gone."""
    root = tmp_path_factory.mktemp("closed")
    source = root / "ckpt"
    source.mkdir()
    for i in range(300):
        (source / f"shard-{i:03d}.bin").write_bytes(i.to_bytes(2, "big") * 50)
    url = str(root / "store") + "/"
    pack(source, url, position=5, run="exp")
    return url


def _with_closed_stdout(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``restorepoint ARGS`` (or ``python -c CODE``) with stdout a pipe whose reader has gone
    before it starts: every write to stdout fails (EPIPE), without a race."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, *(["-c", code] if code else ["-m", "restorepoint"]), *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=BUFFERED,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.slow  # a trial loop: a hundred CLI starts (the tests below are the fast check)
def test_head_one_a_hundred_times_is_quiet(store: str) -> None:
    """The issue's pipeline, in one shell loop: the pipeline exits 0 every time, nothing on
    stderr, and restorepoint's own exit is 0 or 141 (the order of the two processes decides)."""
    script = (
        'for i in $(seq 100); do restorepoint inspect "$1" --latest | head -1 >/dev/null; '
        'echo "${PIPESTATUS[0]} ${PIPESTATUS[1]}"; done'
    )
    bin_dir = Path(sys.executable).parent
    shim = f'{sys.executable} -m restorepoint "$@"'
    env = {**BUFFERED, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-c", f"restorepoint() {{ {shim}; }}; {script}", "loop", store],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0
    assert proc.stderr == ""
    statuses = [tuple(map(int, line.split())) for line in proc.stdout.splitlines()]
    assert len(statuses) == 100
    assert {head for _rp, head in statuses} == {0}
    assert {rp for rp, _head in statuses} <= {0, CLOSED}, statuses


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "{store}", "--latest"],
        ["inspect", "{store}", "--latest", "--json"],
        ["list", "{store}"],
        ["verify", "{store}", "--latest"],
        ["slurm-template", "--", "python", "train.py"],
        ["--version"],
        ["inspect", "--help"],
    ],
    ids=lambda a: " ".join(a).replace("{store}", "STORE"),
)
def test_every_way_out_is_quiet(store: str, args: list[str]) -> None:
    """A verb's lines, its --json, what click prints itself (help) and the --version fast
    path: each a quiet 141."""
    proc = _with_closed_stdout(*(a.format(store=store) for a in args))
    assert (proc.returncode, proc.stderr) == (CLOSED, "")


def test_an_error_keeps_its_code_and_line(tmp_path: Path) -> None:
    """The --json error object is lost with stdout; the failure is still the failure."""
    proc = _with_closed_stdout("inspect", str(tmp_path / "absent.rp"), "--json")
    assert proc.returncode == 4
    (line,) = proc.stderr.splitlines()
    assert line.startswith("restorepoint: error: ") and "absent.rp" in line


def test_what_is_left_for_the_shutdown_flush_goes_quietly(tmp_path: Path) -> None:
    """Output still buffered when a command ends (a library's print) is flushed at
    interpreter shutdown; with stdout closed, Python would print "Exception ignored ...
    BrokenPipeError" and exit 120. The entry point flushes it first, and points stdout at
    /dev/null for what is left."""
    code = (
        "import sys; print('from a library'); from restorepoint._cli import main; "
        f"sys.argv = ['restorepoint', 'inspect', {str(tmp_path / 'absent.rp')!r}]; main()"
    )
    proc = _with_closed_stdout(code=code)
    assert proc.returncode == 4
    (line,) = proc.stderr.splitlines()
    assert line.startswith("restorepoint: error: ")
    code = code.replace("'inspect', ", "'--version', ").split("; sys.argv")[0]
    proc = _with_closed_stdout(code=f"{code}; sys.argv = ['restorepoint', '--help']; main()")
    assert (proc.returncode, proc.stderr) == (CLOSED, "")


def test_on_s3(s3_bucket: str, s3_env: dict[str, str], tmp_path: Path) -> None:
    """Once against moto's S3, where the store's own sockets are in the process too."""
    source = tmp_path / "ckpt"
    source.mkdir()
    for i in range(100):
        (source / f"f{i:03d}").write_bytes(b"x" * 100)
    url = f"s3://{s3_bucket}/store/"
    packed = cli("pack", str(source), url, "--step", "3", "--run", "exp", env=s3_env)
    assert packed.returncode == 0, packed.stderr
    pipeline = f'{sys.executable} -m restorepoint inspect "$1" --latest | head -1'
    proc = subprocess.run(
        ["bash", "-c", pipeline, "pipeline", url],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in s3_env.items() if k != "PYTHONUNBUFFERED"},
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("restore point ")
