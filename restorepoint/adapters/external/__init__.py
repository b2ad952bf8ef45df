"""External trainers: a binary run as a subprocess, described by a profile (TOML).

A profile says how to start the trainer (a command template), when it has reported itself up (a
log regex), how to ask it for a snapshot (a signal), where snapshots land (a glob under the
project directory), how to read a snapshot's step (a log regex with the step and the path,
and/or the file name), how to ask for snapshots every N steps (a flag, in the trainer's own
units), how to resume (an argument template), how to ask the binary its version, and what its
cache depends on. ``LichtFeldAdapter`` is the adapter with the built-in ``profiles/lichtfeld.toml``.

- ``profile``: the profile schema and loading;
- ``log``: parsing the trainer's log for committed snapshots;
- ``steps``: snapshot steps in the trainer's own (scaled) units;
- ``process``: a running trainer (``TrainerProcess``);
- ``adapter``: the adapter itself.

The commit point of a snapshot is the trainer's log line announcing it, printed after the file
was written; a file the log does not announce is never a snapshot while a log exists (docs/
adapters.md, "External trainers and the LichtFeld Studio profile").
"""

from __future__ import annotations

from .adapter import ExternalAdapter, LichtFeldAdapter
from .log import LoggedSnapshot, parse_log
from .process import Disposition, TrainerProcess
from .profile import PROFILE_FORMAT, Profile, builtin_profiles, load_profile

__all__ = [
    "PROFILE_FORMAT",
    "Disposition",
    "ExternalAdapter",
    "LichtFeldAdapter",
    "LoggedSnapshot",
    "Profile",
    "TrainerProcess",
    "builtin_profiles",
    "load_profile",
    "parse_log",
]
