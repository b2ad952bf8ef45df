"""``keep_freed_memory``: what restorepoint's own processes (the CLI, the publish process)
free is taken again without the kernel finding, zeroing and mapping it anew (a minor fault per
page, each costly on a VM that reports freed memory to its host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

CHURN = textwrap.dedent(
    """
    import json, resource, sys, threading
    from restorepoint._posix import keep_freed_memory
    if sys.argv[1] == "cli":  # what the console script does before its verb
        from restorepoint import _cli
        _cli._tune_allocator()
        kept = keep_freed_memory()  # a second call: the same settings, answered again
    else:
        kept = keep_freed_memory() if sys.argv[1] == "keep" else None
    def churn(out):
        # A publish's pattern: a few chunk-sized buffers in flight, all freed, again and again.
        faults = []
        for _ in range(12):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            blocks = [bytearray(4 << 20) for _ in range(8)]
            del blocks
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        out.append(sum(faults[2:]))
    main, pool = [], []
    churn(main)
    t = threading.Thread(target=churn, args=(pool,)); t.start(); t.join()
    print(json.dumps({"kept": kept, "main": main[0], "thread": pool[0]}))
    """
)

#: Ten rounds of 32 MiB: 81,920 pages, each time they are faulted in anew.
PAGE_ROUNDS = 10 * 8 * (4 << 20) // 4096


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    return {**env, **extra}


def _churn(mode: str, **env: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode],
        capture_output=True,
        text=True,
        check=True,
        env=_env(**env),
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_buffers_are_taken_again_without_faulting_them_in() -> None:
    kept = _churn("keep")
    if kept["kept"] is False:
        pytest.skip("this libc has no mallopt (musl)")
    assert kept["kept"] is True
    plain = _churn("plain")
    assert plain["main"] > PAGE_ROUNDS // 2  # the default gives the heap's top back
    for where in ("main", "thread"):
        assert kept[where] < PAGE_ROUNDS // 20, (where, kept, plain)


@pytest.mark.parametrize(
    "setting", [{"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=4096"}]
)
def test_a_users_malloc_setting_wins(setting: dict[str, str]) -> None:
    assert _churn("keep", **setting)["kept"] is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_the_cli_keeps_freed_memory_for_its_verbs() -> None:
    kept = _churn("cli")
    if kept["kept"] is False:
        pytest.skip("this libc has no mallopt (musl)")
    for where in ("main", "thread"):
        assert kept[where] < PAGE_ROUNDS // 20, (where, kept)
