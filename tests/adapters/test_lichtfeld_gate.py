"""The gate with an external trainer's local view (the fake LichtFeld Studio reports its
version; its data directory's digest is a cache key): `pack --adapter` records this machine's
view, `check`, `import --exec` and `run --resume-from` compare it, and a refusal never starts
the trainer. Also `restorepoint local-view`, which shows the view and where each value came
from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clirun import cli

from restorepoint.ops import read_manifest
from restorepoint.testing.fake_lichtfeld import FAKE_COMMIT, FAKE_VERSION

from .test_lichtfeld import FAKE, FAKE_BINARY, fake_adapter, make_data, train

ADAPTER = ("--adapter", "lichtfeld", "--adapter-option", f"binary={FAKE_BINARY}")
JOB = "scene: garden\ntrain:\n  checkpoint_every: 500\n  iterations: 1000\n"


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Machine A: a 1000-iteration run with a snapshot at 500, packed with its local view."""
    root = tmp_path_factory.mktemp("machine-a")
    data = make_data(root)
    out = root / "output"
    assert train(fake_adapter(), data, out, iterations=1000, checkpoint_every=500) == 0
    job = root / "job.yaml"
    job.write_text(JOB)
    url = root / "store" / "splat.rp"
    proc = cli(
        "pack", str(out), str(url), *ADAPTER, "--config", str(job), "--data", str(data),
        "--cache-root", "/cache",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "data": data, "out": out, "job": job, "url": url}


def test_pack_records_this_machines_view(machine: dict[str, Path]) -> None:
    head = read_manifest(str(machine["url"]), head_only=True)
    assert head.trainer is not None
    assert (head.trainer.name, head.trainer.version) == ("lichtfeld-studio", FAKE_VERSION)
    assert dict(head.terms) == {"lichtfeld.commit": FAKE_COMMIT}
    assert set(head.cache_keys) == {"lichtfeld.config", "lichtfeld.data"}
    assert head.cache_keys["lichtfeld.data"].startswith("sha256:")
    assert head.cache_root == "/cache"
    # The profile's snapshot interval is operational: not part of the identity.
    assert head.operational_keys == ("train.checkpoint_every",)


def view(machine: dict[str, Path], data: Path | None = None) -> tuple[str, ...]:
    return (
        *ADAPTER, "--config", str(machine["job"]), "--data", str(data or machine["data"]),
        "--cache-root", "/cache",
    )  # fmt: skip


def test_check_with_the_same_binary_data_and_cache_root_passes(machine: dict[str, Path]) -> None:
    proc = cli("check", str(machine["url"]), *view(machine))
    assert proc.returncode == 0, proc.stderr


def changed_data(machine: dict[str, Path], tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(machine["data"], data)
    (data / "images" / "DSC0001.JPG").write_bytes(b"another photograph")
    return data


def test_one_changed_input_image_is_refused(machine: dict[str, Path], tmp_path: Path) -> None:
    proc = cli("check", str(machine["url"]), *view(machine, changed_data(machine, tmp_path)))
    assert proc.returncode == 3
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("restorepoint:   ")]
    assert len(lines) == 1
    assert lines[0].startswith("restorepoint:   cache_keys.lichtfeld.data: here sha256:")
    assert "(computed: config, data digest of --data)" in lines[0]


def test_what_cannot_be_known_here_is_refused(machine: dict[str, Path]) -> None:
    """Without the job's config this machine cannot know the config identity nor the cache
    key computed from it: refusals, never a pass."""
    proc = cli("check", str(machine["url"]), *ADAPTER, "--data", str(machine["data"]), "--json")
    assert proc.returncode == 3
    found = json.loads(proc.stdout)["error"]["mismatches"]
    assert [(m["field"], m.get("unknown", False)) for m in found] == [
        ("cache_root", True),
        ("cache_keys.lichtfeld.config", False),
        ("config", True),
    ]


def test_another_trainer_version_is_refused(machine: dict[str, Path], tmp_path: Path) -> None:
    url = tmp_path / "other.rp"
    proc = cli(
        "pack", str(machine["out"]), str(url), *view(machine),
        "--trainer", "lichtfeld-studio=v9.9.9",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = cli("check", str(url), *view(machine))
    assert proc.returncode == 3
    assert (
        f"trainer: here lichtfeld-studio={FAKE_VERSION} (detected: {FAKE_BINARY} --version), "
        "in the restore point lichtfeld-studio=v9.9.9"
    ) in proc.stderr


def test_import_exec_is_refused_and_the_trainer_never_starts(
    machine: dict[str, Path], tmp_path: Path
) -> None:
    data = changed_data(machine, tmp_path)
    resumed = tmp_path / "resumed"
    proc = cli(
        "import", str(machine["url"]), str(tmp_path / "restored"), *ADAPTER,
        "--config", str(machine["job"]), "--cache-root", "/cache", "--exec", "--",
        *FAKE, "--headless", "-d", str(data), "-o", str(resumed),
    )  # fmt: skip
    assert proc.returncode == 3
    # The data directory came from the trainer's own -d.
    assert "data digest of the trainer's -d" in proc.stderr
    assert not resumed.exists()
    assert not (tmp_path / "restored").exists()


def test_run_resume_from_is_refused_before_the_trainer_starts(
    machine: dict[str, Path], tmp_path: Path
) -> None:
    data = changed_data(machine, tmp_path)
    out = tmp_path / "out"
    proc = cli(
        "run", "--store", f"{tmp_path / 'store'}/", *ADAPTER, "--workdir", str(out),
        "--config", str(machine["job"]), "--cache-root", "/cache",
        "--resume-from", str(machine["url"]), "--",
        *FAKE, "--headless", "-d", str(data), "-o", str(out), "-i", "1000",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "cache_keys.lichtfeld.data" in proc.stderr
    assert not out.exists()


def test_run_resume_from_with_everything_matching_resumes_to_the_same_state(
    machine: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = cli(
        "run", "--store", f"{tmp_path / 'store'}/", *ADAPTER, "--workdir", str(out),
        "--config", str(machine["job"]), "--cache-root", "/cache",
        "--resume-from", str(machine["url"]), "--",
        *FAKE, "--headless", "-d", str(machine["data"]), "-o", str(out), "-i", "1000",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Checkpoint loaded" in proc.stdout and "iter 500)" in proc.stdout  # resumed, not fresh
    final = (out / "splat_1000.ply").read_bytes()
    assert final == (machine["out"] / "splat_1000.ply").read_bytes()


def test_local_view_shows_each_value_and_where_it_came_from(machine: dict[str, Path]) -> None:
    proc = cli("local-view", *view(machine), "--json")
    assert proc.returncode == 0, proc.stderr
    (fields,) = json.loads(proc.stdout)["views"]
    by_field = {f["field"]: f for f in fields}
    assert by_field["trainer"]["value"] == f"lichtfeld-studio={FAKE_VERSION}"
    assert by_field["trainer"]["source"] == f"detected: {FAKE_BINARY} --version"
    assert by_field["cache_root"] == {
        "field": "cache_root", "known": True, "source": "--cache-root", "value": "/cache",
    }  # fmt: skip
    assert by_field["config_identity"]["source"] == "--config"
    head = read_manifest(str(machine["url"]), head_only=True)
    assert by_field["cache_keys"]["value"] == dict(head.cache_keys)
    text = cli("local-view", *ADAPTER)
    assert text.returncode == 0, text.stderr
    assert "config_identity  unknown here" not in text.stdout
    assert "config           unknown here" in text.stdout
    assert f"lichtfeld-studio={FAKE_VERSION}  [detected: " in text.stdout
