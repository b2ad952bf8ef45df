"""The adapter interface: what restorepoint asks of a trainer (docs/adapters.md).

An adapter produces payloads (asks a running trainer for a snapshot, finds the newest committed
one and its step, lists its files, reports the trainer's name, version and version terms) and
consumes them (given an imported restore point, the command that resumes from it). Adapters
register under the entry-point group ``restorepoint.adapters``; ``restorepoint adapters`` lists
the installed ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .._posix import preempt_signal, signal_number
from ..errors import MissingExtra, UsageError
from ..format import Manifest, Position
from ..ops.gate import Expectations

__all__ = [
    "ENTRY_POINT_GROUP",
    "Adapter",
    "AdapterInfo",
    "Snapshot",
    "TrainerInfo",
    "available_adapters",
    "load_adapter",
    "preempt_signal",
    "send_signal",
    "signal_number",
]

ENTRY_POINT_GROUP = "restorepoint.adapters"


def send_signal(pid: int, signum: int) -> None:
    """Send a running trainer its adapter's signal (a snapshot request, or the preemption
    signal that stops it) through the one guarded request (``runtime.snapshot_request
    .request_snapshot``): nothing is sent to a process that is gone (NotFound, exit 4), not
    this user's, or that does not catch the signal and would die of it (UsageError, exit 2)."""
    from ..runtime.snapshot_request import SnapshotTarget, request_snapshot

    request_snapshot(SnapshotTarget(pid, int(signum), allowed=frozenset({int(signum)})))


@dataclass(frozen=True)
class TrainerInfo:
    """The trainer as a restore point records it."""

    name: str
    version: str
    terms: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """A committed snapshot of a trainer: where its files are (relative to ``root``) and the
    position it holds."""

    root: Path
    files: tuple[str, ...]
    position: Position

    @property
    def step(self) -> int:
        return self.position.step


@runtime_checkable
class Adapter(Protocol):
    """What an adapter provides. Options come from ``--adapter-option K=V`` (the constructor's
    keyword arguments)."""

    name: str

    def trainer(self) -> TrainerInfo:
        """The trainer's name, version (asked of the trainer where it can tell) and terms."""
        ...

    def request_snapshot(self, pid: int) -> None:
        """Ask the running trainer ``pid`` for a snapshot without stopping it."""
        ...

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """The newest snapshot under ``workdir`` that is committed (complete), or None."""
        ...

    def resume_command(
        self, restored: Path, manifest: Manifest, base: Sequence[str] = ()
    ) -> list[str]:
        """The command that resumes training from the restore point unpacked in ``restored``
        (``base``: the trainer's own command line, where the adapter adds to one)."""
        ...

    def local_view(
        self,
        config: Mapping[str, Any] | None = None,
        data: Path | None = None,
        *,
        cache_root: str | None = None,
        command: Sequence[str] = (),
    ) -> Expectations:
        """What this machine expects of a restore point to resume with this trainer (spec
        section 16, "The local view"): the installed trainer and its version, the version
        terms detected here, the cache root and the cache keys computed from the inputs (the
        data directory ``data``, or the one the trainer's ``command`` names), and the config.
        Everything is detected or computed here, never copied from a restore point; what the
        adapter cannot know is left UNSET (the gate then refuses it as unknown here). Each
        known field names its source."""
        ...


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    target: str  # module:attribute
    description: str
    available: bool
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "available": self.available,
            "description": self.description,
            "name": self.name,
            "target": self.target,
        }
        if self.problem:
            out["problem"] = self.problem
        return out


#: The built-in adapters, also declared as entry points in pyproject.toml; listed here too so
#: that a source checkout without installed metadata still finds them.
BUILTIN = {
    "torch": "restorepoint.adapters.torch_adapter:TorchAdapter",
    "lightning": "restorepoint.adapters.lightning:LightningAdapter",
    "transformers": "restorepoint.adapters.transformers.adapter:TransformersAdapter",
    "external": "restorepoint.adapters.external:ExternalAdapter",
    "lichtfeld": "restorepoint.adapters.external:LichtFeldAdapter",
}


def _targets() -> dict[str, str]:
    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.value
    return found


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    import importlib

    module = importlib.import_module(module_name)
    return getattr(module, attr)


def available_adapters() -> list[AdapterInfo]:
    """Every registered adapter, and whether it can be loaded here (its extra installed)."""
    out = []
    for name, target in sorted(_targets().items()):
        try:
            cls = _import(target)
        except MissingExtra as exc:
            out.append(AdapterInfo(name, target, "", False, exc.message))
            continue
        except ImportError as exc:
            out.append(AdapterInfo(name, target, "", False, str(exc)))
            continue
        doc = (cls.__doc__ or "").strip().splitlines()
        out.append(AdapterInfo(name, target, doc[0] if doc else "", True))
    return out


def load_adapter(name: str, **options: Any) -> Adapter:
    """The adapter ``name``, constructed with ``options``; a missing extra is a one-line
    MissingExtra, an unknown name a UsageError."""
    targets = _targets()
    if name not in targets:
        raise UsageError(f"unknown adapter {name!r} (installed: {', '.join(sorted(targets))})")
    try:
        cls = _import(targets[name])
    except ImportError as exc:
        raise UsageError(f"adapter {name!r} cannot be loaded: {exc}") from None
    try:
        adapter = cls(**options)
    except TypeError as exc:
        raise UsageError(f"adapter {name!r}: bad options ({exc})") from None
    if not isinstance(adapter, Adapter):
        raise UsageError(f"{targets[name]} does not implement the adapter interface")
    return adapter
