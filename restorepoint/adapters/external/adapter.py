"""The external-trainer adapter: a trainer binary described by a profile, as restorepoint
sees it: what it is (its version, its local view), how to start it with the snapshot steps,
its committed snapshots and cleaning the project to the newest that verified (``snapshots``:
the commit point is the trainer's log line announcing one), and resuming."""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ...errors import NotFound, UsageError
from ...format import Manifest, Trainer
from ...format.identity import config_identity
from ...ops.gate import Expectations
from ...ops.local_view import cache_root_from_env, data_digest
from ..base import TrainerInfo
from .log import ANSI
from .process import TrainerProcess
from .profile import Profile, builtin_profiles, load_profile, render
from .snapshots import ProjectSnapshots
from .steps import MAX_SNAPSHOT_STEPS, check_every, lround, scaled

__all__ = ["ExternalAdapter", "LichtFeldAdapter"]

_ABSENT: Any = object()
_OPTION_NAMES = ("export", "log", "settle_seconds")


class ExternalAdapter(ProjectSnapshots):
    """External trainer binaries described by a profile (TOML); option profile=FILE."""

    name = "external"

    def __init__(
        self,
        profile: str | os.PathLike[str] | Mapping[str, Any] | Profile | None = None,
        binary: str | Sequence[str] | None = None,
        project: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        if profile is None:
            names = ", ".join(sorted(builtin_profiles()))
            raise UsageError(
                "the external adapter needs a profile: --adapter-option profile=FILE.toml "
                f"(built-in: {names})"
            )
        self.profile = profile if isinstance(profile, Profile) else load_profile(profile)
        if binary is None:
            binary = self.profile.binary
        self.binary: list[str] = shlex.split(binary) if isinstance(binary, str) else list(binary)
        if not self.binary:
            raise UsageError(f"{self.name} adapter: binary is empty")
        self.project = Path(project) if project is not None else None
        unknown = sorted(set(options) - set(_OPTION_NAMES))
        if unknown:
            raise UsageError(
                f"{self.name} adapter: unknown option {unknown[0]!r} "
                f"(known: profile, binary, project, {', '.join(_OPTION_NAMES)})"
            )
        self.export = str(options.get("export", self.profile.export))
        log = options.get("log")
        if log is None:
            self.log_files: tuple[str, ...] = self.profile.log_files
        elif isinstance(log, str):
            self.log_files = tuple(p for p in log.split(",") if p)
        else:
            self.log_files = tuple(str(p) for p in log)
        self.settle_seconds = _option_float(
            options, "settle_seconds", self.profile.settle_seconds, self.name
        )
        self._started: dict[int, TrainerProcess] = {}

    # -- what the trainer is ----------------------------------------------------------------------

    def trainer(self) -> TrainerInfo:
        """Asks the binary: runs the profile's version command and reads the version (and the
        version terms the profile names) with its regex."""
        p = self.profile
        command = render(p.version_command, {}, {"binary": self.binary})
        try:
            proc = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=p.version_timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise UsageError(
                f"{p.name}: trainer binary {self.binary[0]!r} not found "
                "(--adapter-option binary=PATH)"
            ) from None
        except subprocess.TimeoutExpired:
            raise UsageError(
                f"{p.name}: {shlex.join(command)} did not answer within {p.version_timeout:g} s"
            ) from None
        except OSError as exc:
            raise UsageError(f"{p.name}: cannot run {self.binary[0]!r} ({exc})") from None
        output = ANSI.sub("", proc.stdout + "\n" + proc.stderr)
        found = None
        for line in output.splitlines():
            found = p.version_regex.search(line.strip())
            if found:
                break
        if proc.returncode != 0 or found is None:
            first = next((ln for ln in output.splitlines() if ln.strip()), "no output")
            raise UsageError(
                f"{p.name}: {shlex.join(command)} gave no version (exit {proc.returncode}: "
                f"{first.strip()})"
            )
        terms = dict(p.terms)
        for term, group in p.version_terms.items():
            value = found.group(group)
            if value:
                terms[term] = value
        return TrainerInfo(p.trainer, found.group("version"), terms)

    # -- identity of the configuration ----------------------------------------------------------

    @property
    def operational_keys(self) -> tuple[str, ...]:
        """Config keys that change how often the trainer snapshots, never what it trains."""
        return self.profile.operational_keys

    def checkpoint_every(self, config: Mapping[str, Any]) -> int:
        """The snapshot interval a config asks for (0 when it has none)."""
        node: Any = config
        for part in self.profile.checkpoint_every_key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return 0
            node = node[part]
        return check_every(node, self.profile)

    def cache_keys(
        self, config: Mapping[str, Any], data: str | os.PathLike[str] | None = None
    ) -> dict[str, str]:
        """Cache keys of a run of this trainer on ``config`` (and ``data``): the identity of
        the config terms the profile lists (``[cache] config_keys``; by default the whole
        config without its operational keys, so the snapshot interval never invalidates a
        cache), and with ``data`` its data digest (``[cache] data_key``)."""
        keys = {f"{self.profile.name}.config": self._config_key(config)}
        if data is not None:
            keys[self.profile.data_key] = data_digest(data)
        return keys

    def _config_key(self, config: Mapping[str, Any]) -> str:
        listed = self.profile.cache_config_keys
        if not listed:
            return config_identity(config, self.operational_keys)
        picked: dict[str, Any] = {}
        for key in listed:
            node: Any = config
            for part in key.split("."):
                node = node.get(part, _ABSENT) if isinstance(node, Mapping) else _ABSENT
            if node is not _ABSENT:
                picked[key] = node
        return config_identity(picked, ())

    def data_of(self, command: Sequence[str]) -> str | None:
        """The data directory the trainer's ``command`` names (after the profile's data flag,
        ``-d DATA`` or ``-d=DATA``), or None."""
        flag = self.profile.data_flag
        if flag is None:
            return None
        found = None
        for i, arg in enumerate(command):
            if arg == flag and i + 1 < len(command):
                found = command[i + 1]
            elif arg.startswith(flag + "="):
                found = arg[len(flag) + 1 :]
        return found

    def cache_root_of(self, config: Mapping[str, Any] | None) -> str | None:
        key = self.profile.cache_root_key
        if key is None or config is None:
            return None
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node if isinstance(node, str) else None

    def local_view(
        self,
        config: Mapping[str, Any] | None = None,
        data: Path | None = None,
        *,
        cache_root: str | None = None,
        command: Sequence[str] = (),
    ) -> Expectations:
        """What this machine has for this trainer: the binary's own ``--version`` (name and
        version, the profile's version terms, the commit), the cache root (given, else the
        config's ``[cache] root_key``, else ``$RESTOREPOINT_CACHE_ROOT``), the cache keys
        computed from the config and the data directory (``data``, else the one the trainer's
        ``command`` names after its data flag), and the config. A field that cannot be
        computed here is left unknown."""
        info = self.trainer()
        values: dict[str, Any] = {
            "trainer": Trainer(info.name, info.version),
            "terms": dict(info.terms),
        }
        sources = {
            "trainer": f"detected: {shlex.join(self.binary)} --version",
            "terms": (
                f"detected: {shlex.join(self.binary)} --version, the {self.profile.name} profile"
            ),
        }
        root, root_source = cache_root, "--cache-root"
        if root is None:
            root, root_source = self.cache_root_of(config), f"config {self.profile.cache_root_key}"
        if root is None:
            root, root_source = cache_root_from_env(), "RESTOREPOINT_CACHE_ROOT"
        if root is not None:
            values["cache_root"] = root
            sources["cache_root"] = root_source
        where = os.fspath(data) if data is not None else self.data_of(command)
        if config is not None:
            values["config"] = dict(config)
            sources["config"] = "--config"
        keys: dict[str, str] = {}
        computed = []
        if config is not None:
            keys[f"{self.profile.name}.config"] = self._config_key(config)
            computed.append("config")
        if where is not None:
            keys[self.profile.data_key] = data_digest(where)
            flag = "--data" if data is not None else f"the trainer's {self.profile.data_flag}"
            computed.append(f"data digest of {flag}")
        if keys:
            values["cache_keys"] = keys
            sources["cache_keys"] = "computed: " + ", ".join(computed)
        return Expectations(**values, sources=sources)

    # -- starting ---------------------------------------------------------------------------------

    def snapshot_steps(
        self, iterations: int | None, checkpoint_every: int, extra: Sequence[str] = ()
    ) -> list[int]:
        """The values of the snapshot-steps flag for a snapshot every ``checkpoint_every``
        training steps (0: none; under the profile's minimum: refused).

        The trainer scales step values like its evaluation steps: each value times its steps
        scaler (``--steps-scaler`` in ``extra``, default 1) in single precision, rounded half
        away from zero, and so are its iterations. ``checkpoint_every`` counts real training
        steps, so each wanted step k*N below the scaled iteration count is passed as
        round(k*N / scaler); it then lands within scaler/2 of k*N (exactly on it when the
        scaler is 1). The last iteration is left out unless the profile includes it: the
        trainer does not save there."""
        p = self.profile
        every = check_every(checkpoint_every, p)
        if every == 0:
            return []
        scaler = self._scaler(extra)
        total = scaled(iterations if iterations is not None else p.default_iterations, scaler)
        if total // every > MAX_SNAPSHOT_STEPS:
            raise UsageError(
                f"{p.name}: a snapshot every {every} of {total} steps is more than "
                f"{MAX_SNAPSHOT_STEPS} snapshots; choose a larger interval"
            )
        values: list[int] = []
        landed: set[int] = set()
        target = every
        while target < total or (p.include_final and target == total):
            value = target if scaler <= 0 or scaler == 1 else max(1, lround(target / scaler))
            lands = scaled(value, scaler)
            if lands not in landed:
                landed.add(lands)
                values.append(value)
            target += every
        return values

    def build_command(
        self,
        data: str | os.PathLike[str],
        output: str | os.PathLike[str] | None = None,
        iterations: int | None = None,
        checkpoint_every: int = 0,
        extra: Sequence[str] = (),
    ) -> list[str]:
        """The start command: the profile's template, the iterations, the snapshot-steps flag
        computed from ``checkpoint_every`` (see ``snapshot_steps``) and ``extra``."""
        p = self.profile
        if output is None:
            if self.project is None:
                raise UsageError(f"{p.name}: build_command needs an output (or project=)")
            output = self.project
        extra = [str(a) for a in extra]
        if any(a == p.steps_flag or a.startswith(p.steps_flag + "=") for a in extra):
            raise UsageError(
                f"{p.name}: the extra arguments already hold {p.steps_flag}; "
                "give checkpoint_every instead"
            )
        if iterations is not None and (isinstance(iterations, bool) or iterations < 1):
            raise UsageError(f"{p.name}: iterations must be a positive integer")
        steps = self.snapshot_steps(iterations, checkpoint_every, extra)
        spliced = any(item == "{extra}" for item in p.start_command)
        command = render(
            p.start_command,
            {"data": os.fspath(data), "output": os.fspath(output)},
            {"binary": self.binary, "extra": extra},
        )
        if iterations is not None:
            command += render(p.iterations_args, {"iterations": str(iterations)}, {})
        if steps:
            command += [p.steps_flag, p.steps_separator.join(str(s) for s in steps)]
        if not spliced:
            command += extra
        return command

    def iterations_of(self, command: Sequence[str]) -> int | None:
        """The iterations the trainer's ``command`` asks for (the flag of the profile's
        iterations template, ``-i N``), or None (the trainer's default)."""
        template = self.profile.iterations_args
        if len(template) != 2 or template[1] != "{iterations}":
            return None
        flag, found = template[0], None
        for i, arg in enumerate(command):
            if arg == flag and i + 1 < len(command):
                found = command[i + 1]
            elif arg.startswith(flag + "="):
                found = arg[len(flag) + 1 :]
        if found is None:
            return None
        try:
            return int(found)
        except ValueError:
            raise UsageError(f"{self.profile.name}: {flag} {found!r} is not an integer") from None

    def add_snapshot_steps(self, command: Sequence[str], checkpoint_every: int) -> list[str]:
        """The trainer's own ``command`` with the snapshot-steps flag for a snapshot every
        ``checkpoint_every`` training steps (see ``snapshot_steps``: scaled as the trainer
        scales them, never the final iteration, at least the profile's minimum; 0: the
        command unchanged). A command that already holds the flag is refused."""
        p = self.profile
        out = list(command)
        if any(a == p.steps_flag or a.startswith(p.steps_flag + "=") for a in out):
            raise UsageError(
                f"{p.name}: the trainer's command already holds {p.steps_flag}; give --every "
                "(or the config's checkpoint interval) instead"
            )
        steps = self.snapshot_steps(self.iterations_of(out), checkpoint_every, out)
        if steps:
            out += [p.steps_flag, p.steps_separator.join(str(s) for s in steps)]
        return out

    def _scaler(self, extra: Sequence[str]) -> float:
        flag = self.profile.steps_scaler_flag
        if flag is None:
            return 1.0
        value = None
        for i, arg in enumerate(extra):
            if arg == flag and i + 1 < len(extra):
                value = extra[i + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1 :]
        if value is None:
            return 1.0
        try:
            scaler = float(value)
        except ValueError:
            raise UsageError(f"{self.profile.name}: {flag} {value!r} is not a number") from None
        if not math.isfinite(scaler):
            raise UsageError(f"{self.profile.name}: {flag} {value!r} is not finite")
        return scaler

    def start(  # noqa: PLR0913 - the command, where it runs, its output and its signals
        self,
        command: Sequence[str],
        workdir: str | os.PathLike[str] | None = None,
        *,
        log: str | os.PathLike[str] | None = None,
        echo: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
        ignore: Sequence[int] = (),
    ) -> TrainerProcess:
        """Start the trainer; its output goes to ``log`` (default: the profile's first log
        file in ``workdir``) and is read for its readiness and its snapshots. The ``ignore``
        signals are ignored in the trainer's process from its start (the trainer may still
        install a handler of its own)."""
        root = Path(workdir) if workdir is not None else self.project
        if root is None:
            raise UsageError(f"{self.profile.name}: start needs a workdir (or project=)")
        root.mkdir(parents=True, exist_ok=True)
        if log is None:
            if not self.log_files or any(ch in self.log_files[0] for ch in "*?["):
                raise UsageError(f"{self.profile.name}: no log file to write; pass log=")
            log = root / self.log_files[0]
        proc = TrainerProcess(
            self, list(command), root, Path(log), echo=echo, env=env, ignore=ignore
        )
        self._started[proc.pid] = proc
        proc.on_exit = self._forget
        return proc

    def run(
        self,
        command: Sequence[str],
        workdir: str | os.PathLike[str] | None = None,
        *,
        forward: Iterable[int] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
        **kwargs: Any,
    ) -> TrainerProcess:
        """Start the trainer for use as a context manager that forwards signals and yields
        each committed snapshot as it lands::

            with adapter.run(adapter.build_command(data, out, checkpoint_every=1000)) as t:
                for snap in t:                       # committed: announced, file complete
                    pack(snap.root, url, include=list(snap.files), ...); verify(url)
                    adapter.clean_project(out, keep=snap)   # only after the verify
            t.returncode

        Inside the block (in the main thread), the ``forward`` signals (SIGTERM, SIGINT,
        SIGHUP) received by this process are passed to the trainer at once, never held back
        behind a snapshot, and the snapshot signal is passed on once the trainer has reported
        itself up (held until then). Leaving the block stops a trainer still running."""
        proc = self.start(command, workdir, **kwargs)
        proc.forward = tuple(forward)
        return proc

    # -- snapshots --------------------------------------------------------------------------------

    def _forget(self, pid: int) -> None:
        self._started.pop(pid, None)

    def request_snapshot(self, pid: int) -> None:
        """Send the profile's snapshot signal to ``pid``, only to a trainer that has reported
        itself up: one this adapter started must have logged its ready line; for another
        process, where /proc tells, the signal must be caught (an uncaught SIGUSR1 kills)."""
        p = self.profile
        ours = self._started.get(pid)
        if ours is not None:
            ours.request_snapshot()
            return
        # The one way a snapshot request is sent (runtime.snapshot_request): alive, this user's, and
        # catching the signal in /proc (an uncaught SIGUSR1 kills), or nothing is sent.
        from ...runtime.snapshot_request import SnapshotTarget, request_snapshot

        sig = p.snapshot_signal
        try:
            request_snapshot(SnapshotTarget(pid, sig, allowed=frozenset({sig})))
        except NotFound as exc:
            raise UsageError(f"no trainer process {pid}: {exc.message}") from None

    # -- consuming ---------------------------------------------------------------------------------

    def resume_command(
        self, restored: Path, manifest: Manifest, base: Sequence[str] = ()
    ) -> list[str]:
        """``base`` (the trainer's own command line; default: the binary) followed by the
        profile's resume arguments, ``{checkpoint}`` being the restored snapshot file."""
        checkpoint = self._restored_checkpoint(Path(restored), manifest)
        prefix = list(base) if base else list(self.binary)
        return prefix + render(
            self.profile.resume_args,
            {"checkpoint": str(checkpoint), "export": self.export, "restored": str(restored)},
            {},
        )

    def _restored_checkpoint(self, restored: Path, manifest: Manifest) -> Path:
        if manifest.payload is not None:
            names = [e.path for e in manifest.payload]
        else:
            names = [p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()]
        candidates = [n for n in names if self.is_snapshot_file(n.rsplit("/", 1)[-1])]
        if len(candidates) > 1 and self.profile.name_step is not None:
            at_step = [
                n
                for n in candidates
                if (m := self.profile.name_step.search(n.rsplit("/", 1)[-1]))
                and int(m.group("step")) == manifest.position.step
            ]
            candidates = at_step or candidates
        if not candidates:
            raise UsageError(
                f"{self.profile.name}: the restore point holds no file matching "
                f"{self.profile.snapshot_glob}"
            )
        return (restored / sorted(candidates)[-1]).absolute()


def _option_float(options: Mapping[str, Any], key: str, default: float, who: str) -> float:
    if key not in options:
        return default
    try:
        value = float(options[key])
    except (TypeError, ValueError):
        raise UsageError(f"{who} adapter: option {key} must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{who} adapter: option {key} must be a number >= 0")
    return value


class LichtFeldAdapter(ExternalAdapter):
    """LichtFeld Studio (3D Gaussian Splatting) as a subprocess: profiles/lichtfeld.toml."""

    name = "lichtfeld"

    def __init__(
        self,
        binary: str | Sequence[str] | None = None,
        project: str | os.PathLike[str] | None = None,
        profile: str | os.PathLike[str] | Mapping[str, Any] | Profile | None = None,
        **options: Any,
    ) -> None:
        chosen = profile if profile is not None else "lichtfeld"
        super().__init__(chosen, binary, project, **options)
