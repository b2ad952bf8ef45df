"""The external-trainer adapter with a custom profile (the fake trainer's "other" dialect: other
flags, file names, log lines and snapshot signal), and profiles that are wrong in one way each
(one-line errors, from the API and from the CLI)."""

from __future__ import annotations

import copy
import shlex
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import pytest
from clirun import cli, one_error_line

from restorepoint.adapters.base import ENTRY_POINT_GROUP, Adapter, load_adapter
from restorepoint.adapters.external import (
    ExternalAdapter,
    LichtFeldAdapter,
    builtin_profiles,
    load_profile,
)
from restorepoint.errors import UsageError
from restorepoint.ops import import_restore_point, pack, read_manifest
from restorepoint.testing.adapter import AdapterConformance
from restorepoint.testing.fake_lichtfeld import OTHER_VERSION, SIGTERM_EXIT

OTHER = [sys.executable, "-m", "restorepoint.testing.fake_lichtfeld", "--dialect", "other"]
WAIT = 60.0

PROFILE_TOML = """\
format = 1

[profile]
name = "other"
trainer = "other-trainer"
binary = "other-trainer"

[start]
command = ["{binary}", "--data", "{data}", "--out", "{output}"]
iterations = ["--steps", "{iterations}"]
ready = 'ready: accepting snapshot requests'

[snapshot]
signal = "SIGUSR2"
dir = "state"
glob = "step-*.ckpt"
partial = ["*.tmp"]
name_step = 'step-(?P<step>\\d+)\\.ckpt$'
committed = 'committed snapshot step=(?P<step>\\d+) file=(?P<path>\\S+)'

[log]
files = ["trainer-output.txt"]

[steps]
flag = "--snapshot-at"
separator = ";"
default_iterations = 1000
min_every = 100
include_final = false

[resume]
args = ["--from", "{checkpoint}", "--format={export}"]
export = "bin"

[version]
command = ["{binary}", "--version"]
regex = '^other-trainer (?P<version>\\S+)'

[config]
checkpoint_every = "snapshots.every"

[terms]
"other.flavour" = "plain"
"""


def profile_dict() -> dict[str, Any]:
    return tomllib.loads(PROFILE_TOML)


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "other.toml"
    path.write_text(PROFILE_TOML)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("other-data")
    (root / "samples.bin").write_bytes(bytes(range(256)))
    return root


def other_adapter(profile_path: Path) -> ExternalAdapter:
    return ExternalAdapter(profile_path, binary=OTHER)


def finish(adapter: ExternalAdapter, command: list[str], out: Path) -> int:
    with adapter.run(command, out) as trainer:
        for _ in trainer:
            pass
    code = trainer.returncode
    assert code is not None
    return code


@pytest.fixture(scope="module")
def project(profile_path: Path, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("other-run") / "out"
    a = other_adapter(profile_path)
    assert finish(a, a.build_command(data, out, iterations=450, checkpoint_every=100), out) == 0
    return out


class TestCustomProfile(AdapterConformance):
    @pytest.fixture
    def adapter(self, profile_path: Path) -> Adapter:
        return load_adapter("external", profile=str(profile_path), binary=shlex.join(OTHER))

    @pytest.fixture
    def produced(self, project: Path) -> Path:
        return project

    @pytest.fixture
    def expected_step(self) -> int:
        return 400

    def test_is_registered_under_its_name(self, adapter: Adapter) -> None:
        # A profile-driven adapter is registered as "external" and needs its profile.
        assert isinstance(adapter, ExternalAdapter)
        again = load_adapter("external", profile=adapter.profile.source)
        assert type(again) is type(adapter)
        assert again.profile == adapter.profile


def test_the_custom_profile_drives_the_other_trainer(
    profile_path: Path, project: Path, data: Path, tmp_path: Path
) -> None:
    a = other_adapter(profile_path)
    info = a.trainer()
    assert (info.name, info.version) == ("other-trainer", OTHER_VERSION)
    assert info.terms == {"other.flavour": "plain"}
    assert a.build_command(data, "o", iterations=450, checkpoint_every=100) == [
        *OTHER,
        "--data",
        str(data),
        "--out",
        "o",
        "--steps",
        "450",
        "--snapshot-at",
        "100;200;300;400",
    ]
    assert [s.step for s in a.committed_snapshots(project)] == [100, 200, 300, 400]
    assert a.checkpoint_every({"snapshots": {"every": 200}}) == 200
    with pytest.raises(UsageError, match="minimum of 100"):
        a.checkpoint_every({"snapshots": {"every": 50}})

    # Its own snapshot signal (SIGUSR2), while it runs.
    out = tmp_path / "signalled"
    command = a.build_command(data, out, iterations=10**7, extra=["--step-delay", "0.0005"])
    with a.run(command, out) as trainer:
        assert trainer.wait_ready(WAIT)
        a.request_snapshot(trainer.pid)
        snap = trainer.next_snapshot(WAIT)
        assert snap is not None and snap.root == out / "state"
        assert snap.files == (f"step-{snap.step:06d}.ckpt",)
        trainer.terminate()
        assert trainer.wait(WAIT) == SIGTERM_EXIT


def test_the_custom_profile_resumes_to_the_same_final_state(
    profile_path: Path, project: Path, data: Path, tmp_path: Path
) -> None:
    a = other_adapter(profile_path)
    snap = next(s for s in a.committed_snapshots(project) if s.step == 200)
    url = str(tmp_path / "200.rp")
    info = a.trainer()
    pack(
        snap.root,
        url,
        position=snap.position,
        trainer=(info.name, info.version),
        include=list(snap.files),
    )
    restored = tmp_path / "restored"
    result = import_restore_point(url, restored)
    resumed = tmp_path / "resumed"
    base = [*OTHER, "--data", str(data), "--out", str(resumed)]
    command = a.resume_command(restored, result.manifest, base)
    assert command == [*base, "--from", str(restored / "step-000200.ckpt"), "--format=bin"]
    assert finish(a, command, resumed) == 0
    # The export format came from the profile (final.bin); the state is the uninterrupted
    # run's, which exported in the trainer's default format.
    assert (resumed / "final.bin").read_bytes() == (project / "final.ply").read_bytes()
    assert [s.step for s in a.committed_snapshots(resumed)] == [300, 400]
    assert read_manifest(url).position.step == 200


def test_builtin_profiles_ship_and_load() -> None:
    assert "lichtfeld" in builtin_profiles()
    p = load_profile("lichtfeld")
    assert (p.name, p.signal_name, p.steps_flag, p.min_every) == (
        "lichtfeld",
        "SIGUSR1",
        "--save-steps",
        500,
    )
    assert LichtFeldAdapter().profile == p
    assert ExternalAdapter("lichtfeld").profile == p


def test_both_adapters_are_registered_as_entry_points() -> None:
    found = {e.name: e.value for e in entry_points(group=ENTRY_POINT_GROUP)}
    assert found["external"] == "restorepoint.adapters.external:ExternalAdapter"
    assert found["lichtfeld"] == "restorepoint.adapters.external:LichtFeldAdapter"
    assert type(load_adapter("lichtfeld")) is LichtFeldAdapter
    assert type(load_adapter("external", profile="lichtfeld")) is ExternalAdapter


# -- invalid profiles ----------------------------------------------------------------------------


def _set(path: str, value: Any) -> Any:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = d
        for part in parents:
            node = node[part]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return change


_DELETE = object()

INVALID = [
    ("format", _set("format", 2), "top level format: must be 1"),
    ("unknown-section", _set("extras", {"a": 1}), "top level extras: unknown key"),
    ("misspelt-key", _set("start.comand", ["x"]), "[start] comand: unknown key"),
    ("no-profile-table", _set("profile", _DELETE), "top level profile: missing"),
    ("bad-name", _set("profile.name", "no spaces allowed"), "[profile] name: must be letters"),
    ("no-command", _set("start.command", _DELETE), "[start] command: missing"),
    ("command-not-list", _set("start.command", "x --y"), "[start] command: must be a list"),
    ("placeholder", _set("start.command", ["{binary}", "{dataset}"]), "unknown placeholder"),
    ("format-spec", _set("start.iterations", ["{iterations:05d}"]), "takes no format"),
    ("bad-regex", _set("start.ready", "ready ("), "[start] ready: not a valid regular expr"),
    ("no-path-group", _set("snapshot.committed", "saved (?P<step>\\d+)"), "(?P<path>...)"),
    ("kill-signal", _set("snapshot.signal", "SIGKILL"), "SIGKILL stops the trainer"),
    ("term-signal", _set("snapshot.signal", "TERM"), "SIGTERM stops the trainer"),
    ("no-such-signal", _set("snapshot.signal", "SIGNOPE"), "unknown signal SIGNOPE"),
    ("absolute-dir", _set("snapshot.dir", "/var/ckpt"), "[snapshot] dir: must be relative"),
    ("dotdot-glob", _set("snapshot.glob", "../*.ckpt"), "[snapshot] glob: must be relative"),
    ("negative-settle", _set("snapshot.settle_seconds", -1), "must be a number >= 0"),
    ("glob-first-log", _set("log.files", ["*.txt"]), "the first entry is the file"),
    ("min-every-zero", _set("steps.min_every", 0), "[steps] min_every: must be an integer >= 1"),
    ("iterations-str", _set("steps.default_iterations", "1000"), "must be an integer >= 1"),
    ("final-not-bool", _set("steps.include_final", "no"), "must be true or false"),
    ("no-checkpoint", _set("resume.args", ["--from", "x"]), "[resume] args: must use {check"),
    ("no-version-grp", _set("version.regex", "^other (\\S+)"), "(?P<version>...)"),
    ("term-group", _set("version.terms", {"t": "nope"}), "the regex has no group named nope"),
    ("terms-not-str", _set("terms", {"a": 1}), "top level terms: must be a table of strings"),
    ("operational", _set("config.operational", ["a..b"]), "empty path segment"),
]


@pytest.mark.parametrize(
    ("change", "message"), [(c, m) for _, c, m in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_an_invalid_profile_is_one_line_naming_the_key(change: Any, message: str) -> None:
    data = copy.deepcopy(profile_dict())
    change(data)
    with pytest.raises(UsageError) as caught:
        load_profile(data)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("profile (mapping): ")
    assert message in text


def test_a_valid_mapping_loads(profile_path: Path) -> None:
    assert (
        load_profile(profile_dict()).committed.pattern
        == load_profile(profile_path).committed.pattern
    )


def test_profile_files_that_cannot_be_used(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_profile(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("format = 1\n[profile\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_profile(broken)


def test_adapter_options_are_checked(profile_path: Path) -> None:
    with pytest.raises(UsageError, match="needs a profile"):
        ExternalAdapter()
    with pytest.raises(UsageError, match="unknown option 'colour'"):
        ExternalAdapter(profile_path, colour="red")
    with pytest.raises(UsageError, match="settle_seconds must be a number"):
        ExternalAdapter(profile_path, settle_seconds="soon")


def test_invalid_profiles_through_the_cli(profile_path: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(PROFILE_TOML.replace('signal = "SIGUSR2"', 'signal = "SIGKILL"'))
    for option in (f"profile={bad}", f"profile={tmp_path / 'none.toml'}", "colour=red"):
        proc = cli(
            "pack",
            str(tmp_path),
            str(tmp_path / "x.rp"),
            "--adapter",
            "external",
            "--adapter-option",
            option,
        )
        assert proc.returncode == 2
        line = one_error_line(proc)
        assert line.startswith("restorepoint: error:"), line
    proc = cli("pack", str(tmp_path), str(tmp_path / "x.rp"), "--adapter", "external")
    assert proc.returncode == 2
    assert "needs a profile" in one_error_line(proc)
