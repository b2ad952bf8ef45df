"""An Accelerate state directory as restorepoint sees it (``restorepoint.adapters.accelerate``
is the public face): the local view of an Accelerate run, which files are whose (each
process's ``random_states_R.pkl``; the rest the main process's), which are pickles, and the
state record that says a directory is complete.

    DIR/
      model.safetensors, optimizer.bin, scheduler.bin, custom_checkpoint_0.pkl, ...
      random_states_0.pkl ... random_states_{N-1}.pkl
      restorepoint-state.json     the head (with the position), the world size, and each
                                  file's size and sha256: written last, removed first
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._text import printable
from ..errors import RestorePointError
from ..format import Manifest, Position, Trainer
from ..ops import Expectations
from ..runtime.detect import TORCH_TERMS_SOURCE, torch_terms
from ._expect import trainer_view
from ._record import Incomplete, check_files, hashed_index, read_record, write_record

__all__ = [
    "ACCELERATE_HINTS",
    "STATE_RECORD",
    "StateRecord",
    "pickles",
    "rank_of",
    "state_files",
    "view_for",
]

log = logging.getLogger("restorepoint.accelerate")

#: Written into a state directory once every process saved: the head (with the position) and
#: each file's size and sha256. A directory without it, or whose files differ, is not complete.
STATE_RECORD = "restorepoint-state.json"
_RECORD_FORMAT = "restorepoint.accelerate-state/1"
_MAX_RECORD = 4 << 20
#: Each process's own file: the RNG states Accelerate saves per process index.
_RANK_FILE = re.compile(r"random_states_(\d+)\.pkl")
#: What Accelerate loads with torch.load (the weights in ``.safetensors`` need no scan).
_PICKLE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth")

#: What a refusal says to give, in this module's words.
ACCELERATE_HINTS = {
    "trainer": "the restore point was not made by restorepoint.adapters.accelerate",
    "terms": "give terms=",
    "cache_root": "give cache_root= or RESTOREPOINT_CACHE_ROOT",
    "cache_keys": "give cache_keys=",
    "config": "give config=",
}


def view_for(
    version: str,
    config: Mapping[str, Any] | None,
    cache_keys: Mapping[str, str] | None = None,
    cache_root: str | None = None,
    terms: Mapping[str, str] | None = None,
) -> Expectations:
    """What an Accelerate run here expects of a restore point: the installed Accelerate
    (``version``: the trainer ``accelerate=VERSION``), the terms detected here (torch, CUDA
    where present, accelerate) and those given, the cache root and keys given, the config."""
    return trainer_view(
        Trainer("accelerate", version),
        {**torch_terms(), "accelerate": version},
        detected="the installed accelerate",
        terms_source=f"{TORCH_TERMS_SOURCE}, accelerate",
        config=config,
        cache_keys=cache_keys,
        cache_root=cache_root,
        given_terms=terms,
    )


def state_files(directory: Path) -> list[str]:
    """The files of a state directory: its regular files, the record and hidden ones aside."""
    return sorted(
        p.name
        for p in directory.iterdir()
        if p.is_file() and not p.is_symlink() and p.name != STATE_RECORD
        and not p.name.startswith(".")
    )  # fmt: skip


def rank_of(name: str) -> int | None:
    match = _RANK_FILE.fullmatch(name)
    return int(match.group(1)) if match else None


def pickles(names: Sequence[str]) -> list[str]:
    return [n for n in names if n.endswith(_PICKLE_SUFFIXES)]


@dataclass(frozen=True)
class StateRecord:
    """What ``restorepoint-state.json`` says: the head the state was saved with (its
    position), how many processes saved it, and each file's size and sha256."""

    head: Manifest
    world_size: int
    files: Mapping[str, Mapping[str, Any]]

    @property
    def position(self) -> Position:
        return self.head.position

    @classmethod
    def write(
        cls,
        directory: Path,
        head: Manifest,
        world_size: int,
        names: Sequence[str] | None = None,
        index: Mapping[str, tuple[int, str]] | None = None,
    ) -> list[str]:
        """Record the files ``names`` of ``directory`` (all of them, as they are now: every
        process saved), whole or not at all; returns their names. Each file's size and sha256
        come from ``index`` (what the published restore point's index says of them) when it
        names them all, else are hashed here."""
        files = list(names) if names is not None else state_files(directory)
        if index is None or any(n not in index for n in files):
            index = hashed_index(directory, files)
        doc = {
            "files": {n: {"sha256": index[n][1], "size": index[n][0]} for n in files},
            "format": _RECORD_FORMAT,
            "head": head.head_dict(),
            "world_size": world_size,
        }
        write_record(directory / STATE_RECORD, doc)
        return files

    @classmethod
    def read(cls, directory: Path) -> StateRecord | None:
        """The record of ``directory``, validated (the head as a reader validates one; each
        name a plain file name); None when there is none or it cannot be read (a directory
        that is not complete). Hostile until then: it may lie anywhere."""
        file = directory / STATE_RECORD
        if not file.exists() and not file.is_symlink():
            return None
        try:
            doc = read_record(file, _RECORD_FORMAT, _MAX_RECORD)
            files = doc["files"]
            if not isinstance(files, dict) or not all(
                isinstance(n, str) and "/" not in n and "\0" not in n
                and n not in ("", ".", "..")
                and isinstance(v, dict) and isinstance(v.get("size"), int)
                and isinstance(v.get("sha256"), str)
                for n, v in files.items()
            ):  # fmt: skip
                raise ValueError("a bad file list")
            world = doc["world_size"]
            if not isinstance(world, int) or isinstance(world, bool) or world < 1:
                raise ValueError("a bad world size")
            head = Manifest.from_head_dict(doc["head"])
        except (Incomplete, OSError, ValueError, KeyError, TypeError, RestorePointError) as exc:
            log.warning("%s is not a readable state record: %s", file, printable(str(exc)))
            return None
        return cls(head, world, files)

    def incomplete(self, directory: Path) -> str | None:
        """Why the files of ``directory`` are not the ones recorded (a save killed midway, a
        file removed or truncated), or None: the directory is complete."""
        try:
            files = {n: (v["size"], v["sha256"]) for n, v in self.files.items()}
            check_files(directory, files, STATE_RECORD)
        except Incomplete as exc:
            return str(exc)
        return None
