"""restorepoint.testing.process.exit_after, the end of the distributed test workers: the exit code
the interpreter would give, every line written, the worker's own threads waited for, and no
finalization (where torch's gloo run loop aborted a finished rank)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRELUDE = """
import atexit, concurrent.futures, sys, threading, time
from restorepoint.testing.process import exit_after
atexit.register(lambda: print("finalized", flush=True))
"""


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


@pytest.mark.parametrize(
    ("main", "code"),
    [
        ("return None", 0),
        ("return 0", 0),
        ("return 42", 42),
        ("raise SystemExit(42)", 42),
        ("sys.exit()", 0),
        ("return 256 + 3", 3),
    ],
)
def test_the_code_the_interpreter_would_give(main: str, code: int, tmp_path: Path) -> None:
    done = _run(
        f"""
        def main():
            print("worked")  # buffered: a pipe is not a terminal
            {main}
        exit_after(main)
        print("never")
        """,
        tmp_path,
    )
    assert done.returncode == code, done.stderr
    # Every line written, and no finalization: atexit handlers do not run.
    assert done.stdout == "worked\n"
    assert done.stderr == ""


def test_a_message_or_an_exception_is_printed_and_exits_1(tmp_path: Path) -> None:
    done = _run(
        """
        exit_after(lambda: sys.exit("usage: worker ddp ..."))
        """,
        tmp_path,
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "usage: worker ddp ...\n")
    done = _run(
        """
        def main():
            raise ValueError("rank 3 differs")
        exit_after(main)
        """,
        tmp_path,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "Traceback" in done.stderr
    assert done.stderr.rstrip().endswith("ValueError: rank 3 differs")


def test_the_workers_own_threads_are_waited_for(tmp_path: Path) -> None:
    # A non-daemon thread (an upload the worker started) is joined, as the interpreter's shutdown
    # joins it, and an idle thread pool is told to end; a daemon thread is not waited for.
    done = _run(
        """
        def late():
            time.sleep(0.5)
            open("late", "w").write("done")
            print("late", flush=True)
        def main():
            threading.Thread(target=late).start()
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
            # An idle pool, never shut down: its worker ends as at the interpreter's exit.
            pool = concurrent.futures.ThreadPoolExecutor(2)
            assert pool.submit(lambda: 1).result() == 1
            return 7
        exit_after(main)
        """,
        tmp_path,
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "late\n"
    assert (tmp_path / "late").read_text() == "done"
