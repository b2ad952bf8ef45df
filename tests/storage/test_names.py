"""Temporary names are made and taken apart in one module (storage/_names.py): what a writer
makes parses back, and what anyone else may have planted parses to something harmless."""

from __future__ import annotations

import os

import pytest

from restorepoint._posix import pid_alive
from restorepoint.storage import (
    OLD_MARK,
    STAGING_MARK,
    leftover_name,
    parse_leftover,
    parse_partial,
    partial_name,
    this_host,
)


def test_made_names_parse_back() -> None:
    partial = parse_partial(partial_name("x.rp"))
    assert partial is not None and (partial.final, partial.pid) == ("x.rp", os.getpid())
    for mark in (STAGING_MARK, OLD_MARK):
        left = parse_leftover(leftover_name("ckpt", mark), "ckpt")
        assert left is not None
        assert (left.final, left.mark, left.host, left.pid) == (
            "ckpt",
            mark,
            this_host(),
            os.getpid(),
        )
    assert pid_alive(os.getpid())


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        (".x.rp.rp-partial-123-0123456789ab", 123),
        (".a-b.rp.rp-partial-5.rp-partial-7-0123456789ab", 7),  # the last mark counts
        (".x.rp.rp-partial-\u00b2-0123456789ab", None),
        (".x.rp.rp-partial-\u0663-0123456789ab", None),  # int() would read 3
        (".x.rp.rp-partial-+5-0123456789ab", None),
        (".x.rp.rp-partial-5-short", None),
        (".x.rp.rp-partial-", None),
        (".x.rp.rp-partial-99999999999999999999-0123456789ab", 99999999999999999999),
    ],
)
def test_hostile_partial_names(name: str, pid: int | None) -> None:
    parsed = parse_partial(name)
    assert parsed is not None and parsed.pid == pid
    if pid is None or pid > 2**31 - 1:
        assert not parsed.writer_alive


def test_what_is_not_a_temporary_name() -> None:
    assert parse_partial("x.rp.rp-partial-1-0123456789ab") is None  # no leading dot
    assert parse_leftover(".ckpt.rp-importer", "ckpt") is None
    assert parse_leftover(".other.rp-import-h-1-0123456789ab", "ckpt") is None


@pytest.mark.parametrize("pid", [0, -1, 2**31, 2**64])
def test_no_process_has_an_impossible_pid(pid: int) -> None:
    # 0 and -1 would signal a process group (or every process): never asked.
    assert not pid_alive(pid)
