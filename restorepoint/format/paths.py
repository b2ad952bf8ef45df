"""Payload path rules (spec section "Payload paths"). Enforced by the writer on what it packs,
by the reader on every index, and again by the unpacker on every file it writes."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from ..errors import LimitExceeded, UnsafePath
from .limits import MAX_COMPONENT_BYTES, MAX_PATH_BYTES

__all__ = ["check_path", "check_paths", "fold"]

_DRIVE = re.compile(r"^[A-Za-z]:")
# C0 controls, DEL: never part of a checkpoint's file name, and a way to confuse terminals.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_path(path: str) -> str:
    """Return ``path`` if it is a valid payload path, else raise UnsafePath / LimitExceeded."""
    if not isinstance(path, str) or path == "":
        raise UnsafePath("empty payload path")
    shown = ascii(path)
    if len(path.encode("utf-8", errors="surrogatepass")) > MAX_PATH_BYTES:
        raise LimitExceeded(f"payload path longer than {MAX_PATH_BYTES} bytes: {shown[:80]}...")
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
    collide after folding, and that no path is also the parent directory of another."""
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
        files.append(key)
    # A file may not also be a directory of another path ("a" and "a/b").
    file_keys = set(files)
    for key in files:
        parts = key.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in file_keys:
                raise UnsafePath(f"payload path {parent!a} is both a file and a directory")
