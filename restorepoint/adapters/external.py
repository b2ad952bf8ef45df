"""External trainers: a binary run as a subprocess, described by a profile (TOML).

A profile says how to start the trainer (a command template), when it has reported itself up (a
log regex), how to ask it for a snapshot (a signal), where snapshots land (a glob under the
project directory), how to read a snapshot's step (a log regex with the step and the path,
and/or the file name), how to ask for snapshots every N steps (a flag, in the trainer's own
units), how to resume (an argument template) and how to ask the binary its version. The
built-in profiles live in ``profiles/`` beside this module; ``LichtFeldAdapter`` is the
adapter with ``profiles/lichtfeld.toml``.

The commit point of a snapshot is the trainer's log line announcing it, printed after the file
was written; a file the log does not announce is never a snapshot while a log exists (docs/
adapters.md, "External trainers and the LichtFeld Studio profile").
"""

from __future__ import annotations

import codecs
import contextlib
import fnmatch
import glob as globbing
import itertools
import math
import os
import queue
import re
import shlex
import signal
import string
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, NoReturn

from ..errors import UsageError
from ..format import Manifest, Position, Trainer
from ..format.identity import check_operational_key, config_identity
from ..ops.gate import Expectations
from ..ops.local_view import cache_root_from_env, data_digest
from .base import Snapshot, TrainerInfo, send_signal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "PROFILE_FORMAT",
    "ExternalAdapter",
    "LichtFeldAdapter",
    "LoggedSnapshot",
    "Profile",
    "TrainerProcess",
    "builtin_profiles",
    "load_profile",
    "parse_log",
]

PROFILE_FORMAT = 1
_BUILTIN_DIR = "profiles"
# Signals that cannot ask for a snapshot: they stop or kill the trainer.
_FORBIDDEN_SIGNALS = {"SIGKILL", "SIGSTOP", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_LINES = re.compile(r"\r\n|\r|\n")
_REQUIRED: Any = object()
_ABSENT: Any = object()


# -- profiles ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """A validated trainer profile (see ``profiles/lichtfeld.toml`` for a documented one)."""

    name: str
    trainer: str
    description: str
    binary: str
    start_command: tuple[str, ...]
    iterations_args: tuple[str, ...]
    ready: re.Pattern[str]
    snapshot_signal: int
    snapshot_dir: str
    snapshot_glob: str
    partial: tuple[str, ...]
    name_step: re.Pattern[str] | None
    committed: re.Pattern[str]
    settle_seconds: float
    log_files: tuple[str, ...]
    steps_flag: str
    steps_separator: str
    steps_scaler_flag: str | None
    default_iterations: int
    min_every: int
    include_final: bool
    resume_args: tuple[str, ...]
    export: str
    version_command: tuple[str, ...]
    version_regex: re.Pattern[str]
    version_terms: Mapping[str, str]
    version_timeout: float
    checkpoint_every_key: str
    operational_keys: tuple[str, ...]
    terms: Mapping[str, str]
    source: str
    #: the flag before the data directory in the trainer's command (from the start template)
    data_flag: str | None = None
    #: the cache key the data digest goes under
    data_key: str = ""
    #: config keys the trainer's cache depends on ([] : the whole config identity)
    cache_config_keys: tuple[str, ...] = ()
    #: the config key that names the cache root, if the trainer has one
    cache_root_key: str | None = None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.snapshot_signal).name


class _Table:
    """One table of a profile: typed reads that name the key in errors, and unknown keys
    refused once all reads are done (a misspelt key must not be silently ignored)."""

    def __init__(self, data: Any, section: str, source: str) -> None:
        self.source = source
        self.section = section
        if not isinstance(data, Mapping):
            self.fail(None, "must be a table")
        self.data: Mapping[str, Any] = data
        self.seen: set[str] = set()

    def fail(self, key: str | None, problem: str) -> NoReturn:
        where = f"[{self.section}]" if self.section else "top level"
        if key is not None:
            where += f" {key}"
        raise UsageError(f"profile {self.source}: {where}: {problem}")

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                self.fail(key, "missing")
            return default
        return self.data[key]

    def text(self, key: str, default: Any = _REQUIRED, *, empty: bool = False) -> Any:
        value = self.get(key, default)
        if value is default and default is not _REQUIRED:
            return value
        if not isinstance(value, str) or (not empty and not value):
            self.fail(key, "must be a non-empty string" if not empty else "must be a string")
        return value

    def texts(self, key: str, default: Any = _REQUIRED, *, nonempty: bool = True) -> Any:
        value = self.get(key, default)
        if value is default and default is not _REQUIRED:
            return tuple(value)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(key, "must be a list of non-empty strings")
        if nonempty and not value:
            self.fail(key, "must not be empty")
        return tuple(value)

    def integer(self, key: str, default: Any = _REQUIRED, *, minimum: int = 0) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(key, f"must be an integer >= {minimum}")
        return int(value)

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            self.fail(key, "must be a number >= 0")
        if not math.isfinite(value):
            self.fail(key, "must be finite")
        return float(value)

    def flag(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, "must be true or false")
        return value

    def regex(
        self, key: str, default: Any = _REQUIRED, *, groups: Iterable[str] = ()
    ) -> re.Pattern[str] | None:
        value = self.get(key, default)
        if value is None and default is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(key, "must be a non-empty regular expression")
        try:
            pattern = re.compile(value)
        except re.error as exc:
            self.fail(key, f"not a valid regular expression ({exc})")
        for group in groups:
            if group not in pattern.groupindex:
                self.fail(key, f"needs a named group (?P<{group}>...)")
        return pattern

    def table(self, key: str, *, optional: bool = True) -> _Table:
        value = self.get(key, {} if optional else _REQUIRED)
        name = f"{self.section}.{key}" if self.section else key
        return _Table(value, name, self.source)

    def strings(self, key: str) -> dict[str, str]:
        value = self.get(key, {})
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
        ):
            self.fail(key, "must be a table of strings")
        return dict(value)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            self.fail(unknown[0], "unknown key")


def _template(
    table: _Table, key: str, allowed: set[str], default: Any = _REQUIRED, *, nonempty: bool = True
) -> tuple[str, ...]:
    items: tuple[str, ...] = table.texts(key, default, nonempty=nonempty)
    for item in items:
        try:
            fields = list(string.Formatter().parse(item))
        except ValueError as exc:
            table.fail(key, f"bad template {item!r} ({exc})")
        for _, name, spec, conversion in fields:
            if name is None:
                continue
            if name not in allowed:
                table.fail(
                    key,
                    f"unknown placeholder {{{name}}} (allowed: "
                    f"{', '.join('{' + a + '}' for a in sorted(allowed))})",
                )
            if spec or conversion:
                table.fail(key, f"placeholder {{{name}}} takes no format or conversion")
    return items


def _check_glob(table: _Table, key: str, value: str) -> str:
    if value.startswith("/") or ".." in Path(value).parts:
        table.fail(key, "must be relative to the project directory, without '..'")
    return value


def builtin_profiles() -> dict[str, str]:
    """The built-in profiles: name -> TOML text."""
    out = {}
    folder = resources.files(__package__ or "restorepoint.adapters").joinpath(_BUILTIN_DIR)
    for entry in folder.iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[: -len(".toml")]] = entry.read_text(encoding="utf-8")
    return out


def load_profile(source: str | os.PathLike[str] | Mapping[str, Any]) -> Profile:
    """A profile from a TOML file (a path), a built-in profile name (``lichtfeld``), or a
    mapping already parsed; every problem is a one-line UsageError naming the key."""
    if isinstance(source, Mapping):
        return _parse_profile(source, "(mapping)")
    text_source = os.fspath(source)
    builtin = builtin_profiles()
    if text_source in builtin and not Path(text_source).exists():
        label, text = f"{text_source} (built-in)", builtin[text_source]
    else:
        label = text_source
        try:
            text = Path(text_source).read_text(encoding="utf-8")
        except FileNotFoundError:
            known = ", ".join(sorted(builtin))
            raise UsageError(
                f"profile {label}: no such file (and no built-in profile of that name: {known})"
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"profile {label}: cannot be read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid TOML"
        raise UsageError(f"profile {label}: not valid TOML ({first})") from None
    return _parse_profile(data, label)


def _parse_profile(data: Mapping[str, Any], label: str) -> Profile:
    top = _Table(data, "", label)
    fmt = top.get("format")
    if fmt != PROFILE_FORMAT:
        top.fail("format", f"must be {PROFILE_FORMAT} (found {fmt!r})")

    meta = top.table("profile", optional=False)
    name = meta.text("name")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        meta.fail("name", "must be letters, digits, '.', '_' or '-'")
    trainer = meta.text("trainer", name)
    description = meta.text("description", f"{trainer} (external trainer)")
    binary = meta.text("binary")
    meta.done()

    start = top.table("start", optional=False)
    command = _template(start, "command", {"binary", "data", "output", "extra"})
    iterations_args = _template(start, "iterations", {"iterations"}, (), nonempty=False)
    ready = start.regex("ready")
    start.done()
    assert ready is not None

    snap = top.table("snapshot", optional=False)
    signal_name = snap.text("signal")
    if not signal_name.startswith("SIG"):
        signal_name = "SIG" + signal_name
    if signal_name in _FORBIDDEN_SIGNALS:
        snap.fail("signal", f"{signal_name} stops the trainer; it cannot ask for a snapshot")
    try:
        signum = int(signal.Signals[signal_name])
    except KeyError:
        snap.fail("signal", f"unknown signal {signal_name}")
    snapshot_dir = _check_glob(snap, "dir", snap.text("dir", ".", empty=False))
    glob = _check_glob(snap, "glob", snap.text("glob"))
    if "/" in glob:
        snap.fail("glob", "names files in [snapshot] dir; put directories in dir")
    partial = snap.texts("partial", (), nonempty=False)
    name_step = snap.regex("name_step", None, groups=("step",))
    committed = snap.regex("committed", groups=("path",))
    assert committed is not None
    if "step" not in committed.groupindex and name_step is None:
        snap.fail("committed", "needs a (?P<step>...) group, or set name_step")
    settle = snap.number("settle_seconds", 2.0)
    snap.done()

    logs = top.table("log")
    log_files = tuple(_check_glob(logs, "files", f) for f in logs.texts("files", ()))
    if log_files and any(ch in log_files[0] for ch in "*?["):
        logs.fail("files", "the first entry is the file `run` writes: a plain name, not a glob")
    logs.done()

    steps = top.table("steps", optional=False)
    steps_flag = steps.text("flag")
    separator = steps.text("separator", ",")
    scaler_flag = steps.text("scaler_flag", None)
    default_iterations = steps.integer("default_iterations", minimum=1)
    min_every = steps.integer("min_every", 1, minimum=1)
    include_final = steps.flag("include_final", False)
    steps.done()

    resume = top.table("resume", optional=False)
    resume_args = _template(resume, "args", {"checkpoint", "export", "restored"})
    if not any("{checkpoint}" in a for a in resume_args):
        resume.fail("args", "must use {checkpoint}")
    export = resume.text("export", "", empty=True)
    resume.done()

    version = top.table("version", optional=False)
    version_command = _template(version, "command", {"binary"})
    version_regex = version.regex("regex", groups=("version",))
    assert version_regex is not None
    version_terms = version.strings("terms")
    for term, group in version_terms.items():
        if group not in version_regex.groupindex:
            version.fail("terms", f"{term} = {group!r}: the regex has no group named {group}")
    version_timeout = version.number("timeout_seconds", 30.0)
    version.done()

    config = top.table("config")
    every_key = config.text("checkpoint_every", "train.checkpoint_every")
    operational = config.texts("operational", (every_key,), nonempty=False)
    for key in (every_key, *operational):
        try:
            check_operational_key(key)
        except ValueError as exc:
            config.fail("operational", str(exc))
    config.done()

    cache = top.table("cache")
    data_flag = cache.text("data_flag", _data_flag(command))
    data_key = cache.text("data_key", f"{name}.data")
    cache_config_keys = cache.texts("config_keys", (), nonempty=False)
    cache_root_key = cache.text("root_key", None)
    for key in (*cache_config_keys, *([cache_root_key] if cache_root_key else [])):
        try:
            check_operational_key(key)
        except ValueError as exc:
            cache.fail("config_keys", str(exc))
    cache.done()

    terms = top.strings("terms")
    top.done()
    return Profile(
        name=name,
        trainer=trainer,
        description=description,
        binary=binary,
        start_command=command,
        iterations_args=iterations_args,
        ready=ready,
        snapshot_signal=signum,
        snapshot_dir=snapshot_dir,
        snapshot_glob=glob,
        partial=partial,
        name_step=name_step,
        committed=committed,
        settle_seconds=settle,
        log_files=log_files,
        steps_flag=steps_flag,
        steps_separator=separator,
        steps_scaler_flag=scaler_flag,
        default_iterations=default_iterations,
        min_every=min_every,
        include_final=include_final,
        resume_args=resume_args,
        export=export,
        version_command=version_command,
        version_regex=version_regex,
        version_terms=version_terms,
        version_timeout=version_timeout,
        checkpoint_every_key=every_key,
        operational_keys=tuple(sorted(set(operational))),
        terms=terms,
        source=label,
        data_flag=data_flag,
        data_key=data_key,
        cache_config_keys=tuple(cache_config_keys),
        cache_root_key=cache_root_key,
    )


def _data_flag(command: Sequence[str]) -> str | None:
    """The flag that the start template puts before ``{data}`` (``-d`` in ``-d {data}``)."""
    for flag, value in itertools.pairwise(command):
        if value == "{data}" and flag.startswith("-"):
            return flag
    return None


def _render(
    template: Sequence[str], values: Mapping[str, str], splice: Mapping[str, Sequence[str]]
) -> list[str]:
    """Each element formatted with ``values``; an element that is exactly ``{name}`` of a
    ``splice`` entry is replaced by that list (the binary's words, the extra arguments)."""
    out: list[str] = []
    for item in template:
        if item.startswith("{") and item.endswith("}") and item[1:-1] in splice:
            out.extend(splice[item[1:-1]])
        else:
            out.append(item.format_map(values))
    return out


# -- the trainer's log ---------------------------------------------------------------------------


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
        line = _ANSI.sub("", raw)
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


# -- the adapter ---------------------------------------------------------------------------------


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _lround(x: float) -> int:
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def _scaled(value: int, scaler: float) -> int:
    """The trainer's scaling of one step value (single-precision product, lround)."""
    if scaler <= 0 or scaler == 1:
        return value
    return _lround(_f32(_f32(float(value)) * _f32(scaler)))


_OPTION_NAMES = ("export", "log", "settle_seconds")
#: The snapshot steps travel as one argument, and Linux takes at most 128 KiB in one argument
#: (MAX_ARG_STRLEN): 10 000 values of up to 12 characters stay under it.
_MAX_SNAPSHOT_STEPS = 10_000


class ExternalAdapter:
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
        command = _render(p.version_command, {}, {"binary": self.binary})
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
        output = _ANSI.sub("", proc.stdout + "\n" + proc.stderr)
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
        return _check_every(node, self.profile)

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
        every = _check_every(checkpoint_every, p)
        if every == 0:
            return []
        scaler = self._scaler(extra)
        total = _scaled(iterations if iterations is not None else p.default_iterations, scaler)
        if total // every > _MAX_SNAPSHOT_STEPS:
            raise UsageError(
                f"{p.name}: a snapshot every {every} of {total} steps is more than "
                f"{_MAX_SNAPSHOT_STEPS} snapshots; choose a larger interval"
            )
        values: list[int] = []
        landed: set[int] = set()
        target = every
        while target < total or (p.include_final and target == total):
            value = target if scaler <= 0 or scaler == 1 else max(1, _lround(target / scaler))
            lands = _scaled(value, scaler)
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
        command = _render(
            p.start_command,
            {"data": os.fspath(data), "output": os.fspath(output)},
            {"binary": self.binary, "extra": extra},
        )
        if iterations is not None:
            command += _render(p.iterations_args, {"iterations": str(iterations)}, {})
        if steps:
            command += [p.steps_flag, p.steps_separator.join(str(s) for s in steps)]
        if not spliced:
            command += extra
        return command

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

    def start(
        self,
        command: Sequence[str],
        workdir: str | os.PathLike[str] | None = None,
        *,
        log: str | os.PathLike[str] | None = None,
        echo: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> TrainerProcess:
        """Start the trainer; its output goes to ``log`` (default: the profile's first log
        file in ``workdir``) and is read for its readiness and its snapshots."""
        root = Path(workdir) if workdir is not None else self.project
        if root is None:
            raise UsageError(f"{self.profile.name}: start needs a workdir (or project=)")
        root.mkdir(parents=True, exist_ok=True)
        if log is None:
            if not self.log_files or any(ch in self.log_files[0] for ch in "*?["):
                raise UsageError(f"{self.profile.name}: no log file to write; pass log=")
            log = root / self.log_files[0]
        proc = TrainerProcess(self, list(command), root, Path(log), echo=echo, env=env)
        self._started[proc.pid] = proc
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

    def request_snapshot(self, pid: int) -> None:
        """Send the profile's snapshot signal to ``pid``, only to a trainer that has reported
        itself up: one this adapter started must have logged its ready line; for another
        process, where /proc tells, the signal must be caught (an uncaught SIGUSR1 kills)."""
        p = self.profile
        ours = self._started.get(pid)
        if ours is not None:
            ours.request_snapshot()
            return
        state = _signal_disposition(pid, p.snapshot_signal)
        if state == "gone":
            raise UsageError(f"no trainer process {pid}")
        if state == "default":
            raise UsageError(
                f"trainer {pid} has not reported itself up: it does not handle {p.signal_name} "
                "yet, and the signal would kill it"
            )
        if state == "ignored":
            raise UsageError(
                f"trainer {pid} ignores {p.signal_name}: it takes no snapshot requests now"
            )
        send_signal(pid, p.snapshot_signal)

    def _snapshot_base(self, workdir: Path) -> Path:
        return workdir / self.profile.snapshot_dir

    def _is_candidate(self, name: str) -> bool:
        p = self.profile
        return fnmatch.fnmatchcase(name, p.snapshot_glob) and not any(
            fnmatch.fnmatchcase(name, pat) for pat in p.partial
        )

    def _log_paths(self, workdir: Path) -> list[Path]:
        found: dict[Path, float] = {}
        for pattern in self.log_files:
            if any(ch in pattern for ch in "*?["):
                if Path(pattern).is_absolute():
                    matches = [Path(m) for m in globbing.glob(pattern)]
                else:
                    matches = list(workdir.glob(pattern))
            else:
                matches = [Path(pattern) if Path(pattern).is_absolute() else workdir / pattern]
            for m in matches:
                try:
                    if m.is_file():
                        found[m] = m.stat().st_mtime
                except OSError:
                    continue
        # Oldest log first, so that announcements read in the order they were made.
        return sorted(found, key=lambda m: (found[m], str(m)))

    def committed_snapshots(self, workdir: str | os.PathLike[str]) -> list[Snapshot]:
        """Every committed snapshot still in ``workdir``, oldest first.

        With a log: the snapshots the log announces (the announcement is printed after the
        file is written), whose file is still there and not empty; a later announcement of the
        same file replaces the earlier one. Without any log: the files matching the snapshot
        glob with a step in their name, unchanged for ``settle_seconds``."""
        root = Path(workdir)
        base = self._snapshot_base(root)
        logs = self._log_paths(root)
        by_name: dict[str, int] = {}
        if logs:
            for log in logs:
                try:
                    text = log.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                for entry in parse_log(text, self.profile):
                    if self._is_candidate(entry.name):
                        by_name.pop(entry.name, None)
                        by_name[entry.name] = entry.step
            ordered = list(by_name.items())
            return [
                self._snapshot(base, name, step) for name, step in ordered if _complete(base / name)
            ]
        if self.profile.name_step is None or not base.is_dir():
            return []
        now = time.time()
        found: list[tuple[int, float, str]] = []
        for file in base.iterdir():
            if not self._is_candidate(file.name):
                continue
            named = self.profile.name_step.search(file.name)
            try:
                st = file.stat()
            except OSError:
                continue
            if named is None or not file.is_file() or st.st_size == 0:
                continue
            # No announcement to go by: a file still being written keeps changing.
            if now - st.st_mtime < self.settle_seconds:
                continue
            found.append((int(named.group("step")), st.st_mtime, file.name))
        return [self._snapshot(base, name, step) for step, _, name in sorted(found)]

    def _snapshot(self, base: Path, name: str, step: int) -> Snapshot:
        return Snapshot(base, (name,), Position(step=step))

    def newest_snapshot(self, workdir: Path) -> Snapshot | None:
        """The newest committed snapshot under the project directory ``workdir``."""
        snaps = self.committed_snapshots(workdir)
        return snaps[-1] if snaps else None

    def clean_project(
        self, workdir: str | os.PathLike[str], keep: Snapshot | None = None
    ) -> list[Path]:
        """Remove the snapshots older than ``keep``, so only the newest is kept.

        The order is the caller's and it matters: (1) the trainer commits a snapshot (its log
        line); (2) the caller packs it into a restore point and verifies that (restorepoint
        ``pack`` and ``verify``); (3) only then ``clean_project(workdir, keep=snap)``. Here
        ``keep`` is checked again to be committed and complete, and nothing is removed when it
        is not. Snapshots newer than ``keep`` (committed meanwhile, not yet verified), files
        whose step is unknown and partial files stay. ``keep=None`` keeps the newest committed
        snapshot, for a caller that verified it. Returns the removed paths."""
        root = Path(workdir)
        snaps = self.committed_snapshots(root)
        if keep is None:
            if not snaps:
                return []
            keep = snaps[-1]
        base = self._snapshot_base(root)
        kept = {s.files: s.step for s in snaps}
        if kept.get(keep.files) != keep.step or Path(keep.root).resolve() != base.resolve():
            raise UsageError(
                f"{self.profile.name}: {', '.join(keep.files)} (step {keep.step}) is not a "
                f"committed snapshot of {root}; nothing removed"
            )
        steps = {s.files[0]: s.step for s in snaps}
        removed: list[Path] = []
        if not base.is_dir():
            return removed
        for entry in sorted(base.iterdir()):
            name = entry.name
            if name in keep.files or not self._is_candidate(name) or not entry.is_file():
                continue
            step = steps.get(name)
            if step is None and self.profile.name_step is not None:
                named = self.profile.name_step.search(name)
                step = int(named.group("step")) if named else None
            if step is None or step >= keep.step:
                continue
            entry.unlink(missing_ok=True)
            removed.append(entry)
        if removed:
            _fsync_dir(base)
        return removed

    # -- consuming ---------------------------------------------------------------------------------

    def resume_command(
        self, restored: Path, manifest: Manifest, base: Sequence[str] = ()
    ) -> list[str]:
        """``base`` (the trainer's own command line; default: the binary) followed by the
        profile's resume arguments, ``{checkpoint}`` being the restored snapshot file."""
        checkpoint = self._restored_checkpoint(Path(restored), manifest)
        prefix = list(base) if base else list(self.binary)
        return prefix + _render(
            self.profile.resume_args,
            {"checkpoint": str(checkpoint), "export": self.export, "restored": str(restored)},
            {},
        )

    def _restored_checkpoint(self, restored: Path, manifest: Manifest) -> Path:
        if manifest.payload is not None:
            names = [e.path for e in manifest.payload]
        else:
            names = [p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()]
        candidates = [n for n in names if self._is_candidate(n.rsplit("/", 1)[-1])]
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


def _check_every(value: Any, profile: Profile) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(
            f"{profile.name}: {profile.checkpoint_every_key} must be an integer (0: off)"
        )
    if value < 0:
        raise UsageError(f"{profile.name}: {profile.checkpoint_every_key} must not be negative")
    if 0 < value < profile.min_every:
        raise UsageError(
            f"{profile.name}: {profile.checkpoint_every_key} = {value} is below the minimum of "
            f"{profile.min_every} steps (0 turns snapshots off)"
        )
    return value


def _complete(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_file() and st.st_size > 0


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _signal_disposition(pid: int, signum: int) -> str:
    """ "gone", "default", "ignored", "caught", or "unknown" (no /proc to tell)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return "gone" if Path("/proc/self/status").exists() else "unknown"
    except OSError:
        return "unknown"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith(("Z", "X")):
        return "gone"
    bit = 1 << (signum - 1)
    try:
        caught = int(fields["SigCgt"].strip(), 16)
        ignored = int(fields["SigIgn"].strip(), 16)
    except (KeyError, ValueError):
        return "unknown"
    if caught & bit:
        return "caught"
    return "ignored" if ignored & bit else "default"


# -- a running trainer ---------------------------------------------------------------------------


class TrainerProcess:
    """A trainer subprocess started by an adapter: its output is copied to the log (and to
    ``echo``) by a reader thread, which watches it for the ready line and for snapshot
    announcements. Iterate over it for the committed snapshots as they land; the iteration
    ends when the trainer has exited and its output is read."""

    def __init__(
        self,
        adapter: ExternalAdapter,
        command: list[str],
        workdir: Path,
        log: Path,
        *,
        echo: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.adapter = adapter
        self.profile = adapter.profile
        self.command = command
        self.workdir = workdir
        self.log_path = log
        self.echo = echo
        self.forward: tuple[int, ...] | None = None
        self.ready = threading.Event()
        self._pending = False
        self._events: queue.Queue[Snapshot | None] = queue.Queue()
        self._previous: dict[int, Any] = {}
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")  # noqa: SIM115 - closed by the reader thread
        try:
            # A session of its own: a terminal's Ctrl-C or a signal to this process group
            # reaches the trainer once, forwarded, not twice. If this process dies, the
            # trainer's next write to the broken pipe ends it.
            self.popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise UsageError(f"{self.profile.name}: cannot start {command[0]!r} ({exc})") from None
        self.pid = self.popen.pid
        self._reader = threading.Thread(target=self._read, name=f"trainer-{self.pid}", daemon=True)
        self._reader.start()

    # -- output ------------------------------------------------------------------------------

    def _read(self) -> None:
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        pending = b""
        # A character split across two reads is echoed whole.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self._log.write(chunk)
                self._log.flush()
                if self.echo is not None:
                    self.echo.write(decoder.decode(chunk))
                    self.echo.flush()
                pending += chunk
                *lines, pending = re.split(rb"\r\n|\r|\n", pending)
                for raw in lines:
                    self._line(_ANSI.sub("", raw.decode("utf-8", "replace")))
        finally:
            self._log.close()
            self.popen.stdout.close()
            self.popen.wait()
            self.adapter._started.pop(self.pid, None)
            self._events.put(None)

    def _line(self, line: str) -> None:
        if not self.ready.is_set() and self.profile.ready.search(line):
            self.ready.set()
            self._deliver_pending()
        if not self.profile.committed.search(line):
            return
        # The same announcement, parsed the way newest_snapshot parses logs, then the file.
        for entry in parse_log(line + "\n", self.profile):
            base = self.adapter._snapshot_base(self.workdir)
            if self.adapter._is_candidate(entry.name) and _complete(base / entry.name):
                self._events.put(self.adapter._snapshot(base, entry.name, entry.step))

    def next_snapshot(self, timeout: float | None = None) -> Snapshot | None:
        """The next committed snapshot, None once the trainer has exited and its output is
        read; TimeoutError when none came within ``timeout`` seconds."""
        try:
            item = self._events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no snapshot from trainer {self.pid} in {timeout} s") from None
        if item is None:
            self._events.put(None)  # every later call ends too
        return item

    def __iter__(self) -> Iterator[Snapshot]:
        while (item := self.next_snapshot()) is not None:
            yield item

    # -- control -----------------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the trainer reports itself up (False: timed out, or it exited first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if self.popen.poll() is not None and not self._reader.is_alive():
                return self.ready.is_set()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def request_snapshot(self) -> None:
        """Send the snapshot signal; refused (UsageError) before the trainer is up, when the
        signal would kill it."""
        if self.popen.poll() is not None:
            raise UsageError(f"no trainer process {self.pid} (it exited {self.popen.returncode})")
        if not self.ready.is_set():
            raise UsageError(
                f"trainer {self.pid} has not reported itself up yet; "
                f"{self.profile.signal_name} now would kill it"
            )
        send_signal(self.pid, self.profile.snapshot_signal)

    def _deliver_pending(self) -> None:
        if self._pending:
            self._pending = False
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, self.profile.snapshot_signal)

    def send(self, signum: int) -> None:
        """Send any signal now (a stop signal is never held back)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        code = self.popen.wait(timeout)
        self._reader.join(timeout)
        return code

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    # -- signal forwarding -------------------------------------------------------------------

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        # Straight to the trainer: no lock, no wait, whatever else is going on.
        self.send(signum)

    def _on_snapshot(self, signum: int, frame: FrameType | None) -> None:
        self._pending = True
        if self.ready.is_set():
            self._deliver_pending()

    def __enter__(self) -> TrainerProcess:
        if self.forward is not None and threading.current_thread() is threading.main_thread():
            for sig in self.forward:
                self._previous[sig] = signal.signal(sig, self._on_stop)
            snap = self.profile.snapshot_signal
            self._previous[snap] = signal.signal(snap, self._on_snapshot)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            # Leaving the block early (an error, a break) stops the trainer: it must not
            # outlive the code that watches it.
            if self.popen.poll() is None:
                self.terminate()
                try:
                    self.popen.wait(30)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
            self.wait()
        finally:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous.clear()
            self.adapter._started.pop(self.pid, None)


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
