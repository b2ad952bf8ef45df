"""Temporary names: every name restorepoint writes before a commit point is made and parsed
here, and nowhere else (spec sections 15 and 18).

- ``.NAME.rp-partial-PID-HEX``: a publisher's temporary object beside ``NAME`` (15.1, 15.3);
- ``.NAME.rp-import-HOST-PID-HEX``: an import's staging directory beside DEST (18, U6), and
  after an exchange the old tree on its way out;
- ``.NAME.rp-old-HOST-PID-HEX``: an import's old tree, moved aside by the fallback of U9.

A name found in a store or beside DEST is data that anyone with write access there may have
made. Parsing never fails: a PID that is not ASCII decimal digits (``str.isdigit`` and ``int``
also take ``²`` or ``٣``) is no PID at all, and a decimal one that no process can have (0, or
beyond ``pid_t``, which would make ``os.kill`` raise OverflowError) names no live process. Such
a name can neither crash a cleanup nor keep a leftover alive.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass

from .._posix import pid_alive

__all__ = [
    "OLD_MARK",
    "PARTIAL_MARK",
    "STAGING_MARK",
    "TempName",
    "is_partial_name",
    "leftover_name",
    "parse_leftover",
    "parse_partial",
    "partial_name",
    "this_host",
]

#: Every temporary name a publisher creates contains this mark and starts with a dot, so that
#: listings never take a leftover for a restore point and cleanups can find it.
PARTIAL_MARK = ".rp-partial-"
#: An import's staging directory (and, after an exchange, the old tree being removed).
STAGING_MARK = ".rp-import-"
#: An import's old tree, moved aside where no atomic exchange exists.
OLD_MARK = ".rp-old-"
_PID = re.compile(r"[0-9]{1,64}")
_TOKEN = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class TempName:
    """A temporary name taken apart. ``pid`` is None when the name holds no decimal PID where
    one belongs (it may still be one no process can have, which ``writer_alive`` tells); ``host`` is
    None for partial names, which hold none."""

    final: str
    mark: str
    host: str | None
    pid: int | None
    token: str

    @property
    def writer_alive(self) -> bool:
        """Whether the process the name names runs on this host: never for no PID, or for one
        that no process can have (0, or beyond pid_t: ``restorepoint._posix.pid_alive``)."""
        return self.pid is not None and pid_alive(self.pid)


def this_host() -> str:
    """The host part of an import's temporary names: one path component, never empty."""
    return socket.gethostname().replace("/", "_") or "host"


def _token() -> str:
    return secrets.token_hex(6)


def parse_pid(text: str) -> int | None:
    """The number ``text`` spells in ASCII decimal digits, or None."""
    return int(text) if _PID.fullmatch(text) else None


# -- partial names (publishing) -----------------------------------------------------------


def is_partial_name(name: str) -> bool:
    """Whether ``name`` (one path component) is a partial name: never a restore point."""
    return name.startswith(".") and PARTIAL_MARK in name


def partial_name(final: str, *, pid: int | None = None, suffix: str | None = None) -> str:
    """The temporary name beside ``final`` for this process (``pid`` and the 12 hex digits of
    ``suffix`` for tests that plant one)."""
    pid = os.getpid() if pid is None else pid
    return f".{final}{PARTIAL_MARK}{pid}-{suffix or _token()}"


def parse_partial(name: str) -> TempName | None:
    """A partial name taken apart (None if it is not one). Whatever follows the last mark, a
    partial name stays one; only its PID may be unknown."""
    if not is_partial_name(name):
        return None
    head, _, tail = name.rpartition(PARTIAL_MARK)
    pid_text, _, token = tail.partition("-")
    pid = parse_pid(pid_text) if _TOKEN.fullmatch(token) else None
    return TempName(head[1:], PARTIAL_MARK, None, pid, token)


# -- leftover names (importing) -----------------------------------------------------------


def leftover_name(final: str, mark: str) -> str:
    """A fresh staging (``STAGING_MARK``) or old-tree (``OLD_MARK``) name for DEST ``final``."""
    assert mark in (STAGING_MARK, OLD_MARK)
    return f".{final}{mark}{this_host()}-{os.getpid()}-{_token()}"


def parse_leftover(name: str, final: str) -> TempName | None:
    """A leftover of an import into DEST ``final`` taken apart, or None when ``name`` does not
    start with one of its prefixes. The host is everything up to the PID (a host name may hold
    ``-``); ``pid`` is None unless the name ends in ``-PID-HEX``."""
    for mark in (STAGING_MARK, OLD_MARK):
        prefix = f".{final}{mark}"
        if not name.startswith(prefix):
            continue
        owner, _, token = name[len(prefix) :].rpartition("-")
        host, _, pid_text = owner.rpartition("-")
        pid = parse_pid(pid_text) if host and _TOKEN.fullmatch(token) else None
        return TempName(final, mark, host or None, pid, token)
    return None
