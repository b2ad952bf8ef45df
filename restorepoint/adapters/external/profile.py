"""Trainer profiles: the TOML file that describes an external trainer binary (docs/adapters.md,
"The profile format"): how to start it, when it is up, how to ask it for a snapshot, where its
snapshots land and how their step is read, its steps flag, how to resume, how to ask its
version, and what its cache depends on. Every problem is a one-line UsageError naming the key.
The built-in profiles live in ``profiles/`` beside this module."""

from __future__ import annotations

import itertools
import math
import os
import re
import signal
import string
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from ..._posix import read_regular
from ...errors import UsageError
from ...format.identity import check_operational_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["PROFILE_FORMAT", "Profile", "builtin_profiles", "load_profile", "render"]

PROFILE_FORMAT = 1
_BUILTIN_DIR = "profiles"
# Signals that cannot ask for a snapshot: they stop or kill the trainer.
_FORBIDDEN_SIGNALS = {"SIGKILL", "SIGSTOP", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT"}
_REQUIRED: Any = object()


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
            text = read_regular(text_source).decode("utf-8")
        except FileNotFoundError:
            known = ", ".join(sorted(builtin))
            raise UsageError(
                f"profile {label}: no such file (and no built-in profile of that name: {known})"
            ) from None
        except OSError as exc:
            raise UsageError(f"profile {label}: cannot be read ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise UsageError(f"profile {label}: cannot be read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid TOML"
        raise UsageError(f"profile {label}: not valid TOML ({first})") from None
    return _parse_profile(data, label)


def _parse_profile(data: Mapping[str, Any], label: str) -> Profile:  # noqa: PLR0912, PLR0915 - one check per profile key, in the order docs/adapters.md lists them
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


def render(
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
