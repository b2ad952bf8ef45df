"""The trainer's log: the announcements of committed snapshots (``Checkpoint saved: PATH (...,
iter N)``), read as the trainer writes them, progress bars and colours included."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .profile import Profile

__all__ = ["ANSI", "LoggedSnapshot", "parse_log"]

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_LINES = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class LoggedSnapshot:
    """A snapshot the trainer's log announces as written: its step, and its file as logged."""

    step: int
    path: str

    @property
    def name(self) -> str:
        return self.path.replace("\\", "/").rsplit("/", 1)[-1]


def parse_log(text: str, profile: Profile) -> list[LoggedSnapshot]:
    """Every snapshot ``text`` announces, in the order announced.

    The text after the last newline is left out: a line the trainer is still writing is not
    an announcement yet. Lines are also split at carriage returns (progress bars redraw with
    them), colour escapes are removed, and the announcement is searched anywhere in a line, so
    a progress bar or an evaluation printed on the same line does not hide it."""
    end = text.rfind("\n")
    out: list[LoggedSnapshot] = []
    for raw in _LINES.split(text[: end + 1]):
        line = ANSI.sub("", raw)
        found = profile.committed.search(line)
        if found is None:
            continue
        path = found.group("path").strip()
        step_text = found.groupdict().get("step")
        if step_text is None and profile.name_step is not None:
            by_name = profile.name_step.search(path.replace("\\", "/").rsplit("/", 1)[-1])
            step_text = by_name.group("step") if by_name else None
        if step_text is None:
            continue
        out.append(LoggedSnapshot(int(step_text), path))
    return out
