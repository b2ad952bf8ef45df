"""A Trainer's ``checkpoint-N`` directory as restorepoint sees it: the record that says it is
complete, the check of that record, and the weights-only scan of its pickles.

**The record** (``checkpoint-N/restorepoint.json``, written whole: temporary file, fsync,
rename) holds the head of the restore point the checkpoint was published as (or would have
been, without a store: its identity at its position) and the index of its files: each path,
size and sha256, taken from the published restore point's index (or hashed here, without a
store). It is written after the checkpoint's publish, on the training thread (so never while
the Trainer rotates the directory away), and by every import of a restore point into a
checkpoint directory. A checkpoint is **complete** when its record is sound, names this
step, and every file it lists is there with its size and sha256. The Trainer writes a
checkpoint file by file and never marks one done: a directory killed half way (files
missing, one truncated) has no record, or files that do not match it, and is skipped.

**Weights-only.** The Trainer loads ``rng_state*.pth``, ``optimizer.pt``, ``scheduler.pt`` and
``scaler.pt`` with torch.load; before it does, each passes the runtime's allowlist scan and
weights-only load (``check_loadable``, spec section 24). ``training_args.bin`` (a pickle of
the TrainingArguments class, which the Trainer never loads on a resume) is never published
and never imported.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import RestorePointError
from ...format import Manifest
from ...runtime.safe_load import check_loadable
from .._record import Incomplete, check_files, hashed_index, payload_index, read_record
from .._record import write_record as _write

__all__ = [
    "PICKLES",
    "RECORD",
    "UNPUBLISHED",
    "Complete",
    "check_pickles",
    "checkpoint_step",
    "checkpoints",
    "complete",
    "file_index",
    "write_record",
]

log = logging.getLogger("restorepoint.transformers")

#: The record of a complete checkpoint, inside it.
RECORD = "restorepoint.json"
_RECORD_FORMAT = "restorepoint-transformers-checkpoint/1"
_RECORD_LIMIT = 16 << 20
#: The Trainer's checkpoint directories (transformers' PREFIX_CHECKPOINT_DIR).
_CHECKPOINT = re.compile(r"checkpoint-(\d{1,12})")
#: Files of a checkpoint that are never published (nor imported): a pickle of a class that
#: the Trainer does not load on a resume, and the record itself (written after the publish).
UNPUBLISHED = ("training_args.bin", RECORD)
#: The pickles the Trainer loads on a resume (torch.load), checked weights-only first.
PICKLES = re.compile(r"(rng_state(_\d+)?\.pth|optimizer\.pt|scheduler\.pt|scaler\.pt)")


def checkpoint_step(path: Path) -> int | None:
    match = _CHECKPOINT.fullmatch(path.name)
    return int(match.group(1)) if match else None


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """The ``checkpoint-N`` directories of ``output_dir``, newest (highest N) first."""
    try:
        entries = list(output_dir.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for path in entries:
        step = checkpoint_step(path)
        if step is not None and path.is_dir() and not path.is_symlink():
            found.append((step, path))
    return sorted(found, key=lambda pair: pair[0], reverse=True)


def published_files(directory: Path) -> list[str]:
    """The files of a checkpoint that a publish packs (relative paths, sorted)."""
    out = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if rel not in UNPUBLISHED:
                out.append(rel)
    return sorted(out)


def file_index(directory: Path, manifest: Manifest | None = None) -> dict[str, list[Any]]:
    """``{path: [size, sha256]}``: the published restore point's index when given, else the
    files of ``directory`` hashed here."""
    index = payload_index(manifest) or hashed_index(directory, published_files(directory))
    return {rel: [size, sha256] for rel, (size, sha256) in index.items()}


def write_record(
    directory: Path, head: Mapping[str, Any], index: Mapping[str, list[Any]], url: str | None
) -> None:
    """Write the record, leaving the directory's modification time as it was: the Trainer's
    rotation (``save_total_limit``) orders checkpoints by it, and a record written after a
    newer checkpoint was saved would make the older one look newest (the newest then
    rotated away)."""
    doc = {"format": _RECORD_FORMAT, "head": dict(head), "files": dict(index), "url": url}
    _write(directory / RECORD, doc, keep_mtime_of=directory)


class Complete:
    """A checkpoint found complete: its directory, its step, the head its record holds, and
    where it was published (None: not published)."""

    def __init__(self, path: Path, step: int, head: Manifest, url: str | None) -> None:
        self.path = path
        self.step = step
        self.head = head
        self.url = url


def complete(directory: Path) -> Complete:
    """The checkpoint's record, checked against its files (Incomplete when it is not: one
    line saying why). Hostile until checked: the record is size-capped and read without
    blocking, its head validated as a reader validates one, its paths by the spec's rules."""
    step = checkpoint_step(directory)
    if step is None:
        raise Incomplete("not a checkpoint-N directory")
    doc = read_record(directory / RECORD, _RECORD_FORMAT, _RECORD_LIMIT)
    try:
        head = Manifest.from_head_dict(doc.get("head"))
    except (RestorePointError, TypeError, ValueError) as exc:
        raise Incomplete(f"{RECORD} holds no readable head ({exc})") from None
    if head.position.step != step:
        raise Incomplete(f"{RECORD} is of step {head.position.step}, not {step}")
    files = doc.get("files")
    url = doc.get("url")
    if not isinstance(files, dict) or not files or not (url is None or isinstance(url, str)):
        raise Incomplete(f"{RECORD} lists no files")
    index: dict[str, tuple[int, str]] = {}
    for rel, entry in files.items():
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], int)
            and isinstance(entry[1], str)
        ):
            raise Incomplete(f"{RECORD} has a bad entry for {rel}")
        index[rel] = (entry[0], entry[1])
    check_files(directory, index, RECORD)
    return Complete(directory, step, head, url)


def check_pickles(directory: Path, safe_globals: Sequence[Any] = ()) -> None:
    """Every pickle the Trainer will load from ``directory`` passes the allowlist scan and
    the weights-only load first: UnsafeCheckpoint (exit 1) naming the file otherwise."""
    for path in sorted(directory.iterdir()):
        if PICKLES.fullmatch(path.name):
            check_loadable(path, extra_globals=safe_globals)


def iter_complete(output_dir: Path) -> Iterator[tuple[int, Path, Complete | str]]:
    """Each checkpoint of ``output_dir``, newest first, with its record (complete) or why it
    is not."""
    for step, path in checkpoints(output_dir):
        try:
            yield step, path, complete(path)
        except Incomplete as exc:
            yield step, path, str(exc)
