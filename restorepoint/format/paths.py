"""Payload path rules (spec section "Payload paths"). Enforced by the writer on what it packs,
by the reader on every index, and again by the unpacker on every file it writes."""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterable

from ..errors import LimitExceeded, UnsafePath
from .limits import MAX_COMPONENT_BYTES, MAX_PATH_BYTES, MAX_PATH_DEPTH

__all__ = ["check_path", "check_paths", "fold"]

_DRIVE = re.compile(r"^[A-Za-z]:")
# C0 controls, DEL: never part of a checkpoint's file name, and a way to confuse terminals.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: An empty, "." or ".." component (a leading "/" is refused before).
_BAD_COMPONENT = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")
#: The components that may be longer than MAX_COMPONENT_BYTES (a character is at most 4 bytes).
_LONG_COMPONENT = re.compile("[^/]{" + str(-(-(MAX_COMPONENT_BYTES + 1) // 4)) + ",}")


def check_path(path: str) -> str:  # noqa: PLR0912 - one branch per rule of spec section 9
    """Return ``path`` if it is a valid payload path, else raise UnsafePath / LimitExceeded."""
    if not isinstance(path, str) or path == "":
        raise UnsafePath("empty payload path")
    shown = ascii(path)
    if len(path.encode("utf-8", errors="surrogatepass")) > MAX_PATH_BYTES:
        raise LimitExceeded(f"payload path longer than {MAX_PATH_BYTES} bytes: {shown[:80]}...")
    if path.count("/") >= MAX_PATH_DEPTH:
        raise LimitExceeded(
            f"payload path of more than {MAX_PATH_DEPTH} components: {shown[:80]}..."
        )
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"payload path is not valid Unicode: {shown}") from None
    if "\x00" in path:
        raise UnsafePath(f"payload path contains NUL: {shown}")
    if _CONTROL.search(path):
        raise UnsafePath(f"payload path contains a control character: {shown}")
    if "\\" in path:
        raise UnsafePath(f"payload path contains a backslash: {shown}")
    if path.startswith("/"):
        raise UnsafePath(f"payload path is absolute: {shown}")
    if _DRIVE.match(path):
        raise UnsafePath(f"payload path starts with a drive: {shown}")
    too_long = any(
        len(m.group().encode("utf-8")) > MAX_COMPONENT_BYTES for m in _LONG_COMPONENT.finditer(path)
    )
    if not (too_long or _BAD_COMPONENT.search(path)):
        # The common case, in a few passes of the regex engine over the path, whatever its
        # depth: a loop in Python over the components of every path made a deep path several
        # times dearer than a shallow one of the same length. The loop below, for a path
        # that breaks rule 8, finds which rule its first bad component breaks.
        return path
    for part in path.split("/"):
        if part == "":
            raise UnsafePath(f"payload path has an empty component: {shown}")
        if part in (".", ".."):
            raise UnsafePath(f"payload path has a {part!r} component: {shown}")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise LimitExceeded(
                f"payload path component longer than {MAX_COMPONENT_BYTES} bytes: {shown[:80]}"
            )
    return path


def fold(path: str) -> str:
    """The key two paths collide under: Unicode compatibility normalisation and case folding,
    as case-insensitive or normalising file systems (macOS, Windows) would compare them."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", path).casefold())


def check_paths(paths: Iterable[str]) -> None:
    """Check each path, that they are strictly sorted (UTF-8 byte order), and that no two
    collide after folding, and that no path is also the parent directory of another. The work
    is linear in the total length of the paths, however deep they are."""
    seen: dict[str, str] = {}
    files: list[str] = []
    previous: bytes | None = None
    for path in paths:
        check_path(path)
        raw = path.encode("utf-8")
        if previous is not None and raw <= previous:
            if raw == previous:
                raise UnsafePath(f"duplicate payload path: {path!a}")
            raise UnsafePath(f"payload paths not in sorted order at {path!a}")
        previous = raw
        key = fold(path)
        if key in seen:
            raise UnsafePath(
                f"payload paths {seen[key]!a} and {path!a} collide after case folding"
                " and Unicode normalisation"
            )
        seen[key] = path
        # "/" as the smallest character: then every path below a directory D sorts right after
        # D itself. No folded path holds NUL: paths hold no control character (rule 4), and
        # folding never makes one (checked for every code point).
        files.append(key.replace("/", "\x00"))
    # A file may not also be a directory of another path ("a" and "a/b"). Trying every parent
    # of every path (the way this was checked before) costs the square of a path's depth.
    files.sort()
    for key, after in itertools.pairwise(files):
        if after.startswith(key + "\x00"):
            parent = key.replace("\x00", "/")
            raise UnsafePath(f"payload path {parent!a} is both a file and a directory")
