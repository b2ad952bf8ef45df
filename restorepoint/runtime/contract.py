"""The run-directory contract, defined once: the file names of a run directory, the
environment a supervisor (``restorepoint run``) hands a trainer, and the resumable exit code.
The runtime (ResumableRun), ``restorepoint snapshot`` and the supervisor read these names from
here and nowhere else (docs/adapters.md, "The run directory")."""

from __future__ import annotations

from ..ops.local_view import CACHE_ROOT_ENV

__all__ = [
    "CACHE_ROOT_ENV",
    "EXIT_INCOMPATIBLE",
    "EXIT_RESUMABLE",
    "READY_ENV",
    "REFUSED_FILE",
    "RESUME_DIR_ENV",
    "RESUME_HEAD_ENV",
    "SIGNING_KEY_ENV",
    "STORE_ENV",
]

#: The documented exit code of a run that stopped on request and can be resumed (42).
EXIT_RESUMABLE = 42
#: A resume the gate refused: the trainer did not train; a scheduler must not requeue it.
EXIT_INCOMPATIBLE = 3

#: Where a supervised trainer reports itself up: ``$RESTOREPOINT_READY_DIR/PID.json``.
READY_ENV = "RESTOREPOINT_READY_DIR"
#: The store a supervisor publishes to, handed to a trainer that publishes itself.
STORE_ENV = "RESTOREPOINT_STORE"
#: A restore point the supervisor imported for the trainer: the payload directory ...
RESUME_DIR_ENV = "RESTOREPOINT_RESUME_DIR"
#: ... and its head, which a trainer that gates itself compares with its own local view.
RESUME_HEAD_ENV = "RESTOREPOINT_RESUME_HEAD"
#: The Ed25519 private key a supervised trainer signs its restore points with.
SIGNING_KEY_ENV = "RESTOREPOINT_SIGNING_KEY"
#: Written into the ready directory by a trainer whose resume the gate refused: the refused
#: field names, for the supervisor's telemetry.
REFUSED_FILE = "resume-refused.json"
