"""`restorepoint check` and the gate of `restorepoint import`, as a user meets them: exit 0 or 3,
one stderr line per mismatch, the refusal as data with --json, handoff files from `pack
--handoff` overridden by options, and an import refused before DEST exists."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from clirun import cli, one_error_line

from restorepoint._cli.import_ import HEAD_ONLY
from restorepoint.ops import read_manifest

TERMS = ("--term", "cuda=12.4", "--term", "torch=2.13.0")


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text("lr: 0.001\nmodel:\n  width: 64\ntrain:\n  checkpoint_every: 500\n")
    return path


@pytest.fixture
def packed(tmp_path: Path, config_file: Path) -> tuple[str, Path]:
    """A restore point packed by the CLI, and the handoff file it wrote beside it."""
    source = tmp_path / "ckpt"
    (source / "sub").mkdir(parents=True)
    (source / "model.bin").write_bytes(bytes(range(256)) * 100)
    (source / "sub" / "state.json").write_text('{"step": 7}')
    url = str(tmp_path / "store" / "step-7.rp")
    handoff = tmp_path / "handoff.json"
    proc = cli(
        "pack", str(source), url, "--step", "7", "--trainer", "t=1.0", *TERMS,
        "--config", str(config_file), "--operational", "train.checkpoint_every",
        "--key", "dataset=abc", "--cache-root", "/cache", "--level", "0",
        "--handoff", str(handoff),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return url, handoff


def mismatch_lines(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    assert lines[0].startswith("restorepoint: error: "), stderr
    assert all(line.startswith("restorepoint:   ") for line in lines[1:]), stderr
    return [line.removeprefix("restorepoint:   ") for line in lines[1:]]


def everything(config_file: Path) -> tuple[str, ...]:
    """Every field the packed restore point records, known here from the options."""
    return (
        "--trainer", "t=1.0", *TERMS, "--key", "dataset=abc", "--cache-root", "/cache",
        "--config", str(config_file),
    )  # fmt: skip


def test_check_compatible(packed: tuple[str, Path], config_file: Path) -> None:
    url, _ = packed
    proc = cli("check", url, *everything(config_file))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{HEAD_ONLY}: step 7 at {url}\n"
    assert proc.stderr == ""


def test_check_verify_reads_what_the_head_does_not(
    packed: tuple[str, Path], config_file: Path, tmp_path: Path
) -> None:
    """Half the object cut away: the gate (head only) passes, and says that is all it read;
    --verify then fails as verify does (exit 1, one line); a sound one passes both."""
    url, handoff = packed
    proc = cli("check", url, *everything(config_file), "--verify", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["checked"] == "all" and out["compatible"] is True
    assert out["verify"]["ok"] is True and out["verify"]["files"] == 2
    proc = cli("check", url, *everything(config_file), "--verify")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith(f"compatible and verified: step 7 at {url}, 2 files, ")

    cut = tmp_path / "cut.rp"
    data = Path(url).read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    proc = cli("check", str(cut), *everything(config_file))
    assert (proc.returncode, proc.stdout) == (0, f"{HEAD_ONLY}: step 7 at {cut}\n")
    head_only = cli("check", str(cut), "--expect", str(handoff), "--json")
    assert json.loads(head_only.stdout)["checked"] == "head"
    proc = cli("check", str(cut), *everything(config_file), "--verify")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "restorepoint: error: " in one_error_line(proc)
    # A refusal by the gate comes first, and nothing more is read.
    proc = cli("check", str(cut), "--verify", "--trainer", "other=1", *TERMS)
    assert proc.returncode == 3
    proc = cli("check", url, "--identity", str(tmp_path / "key"), *everything(config_file))
    assert proc.returncode == 2 and "--verify" in one_error_line(proc)


def test_check_compatible_json(packed: tuple[str, Path]) -> None:
    url, handoff = packed
    proc = cli("check", url, "--expect", str(handoff), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["compatible"] is True and out["gated"] is True
    assert out["mismatches"] == []
    assert out["position"] == {"step": 7}
    assert out["url"] == url


def test_check_refused_prints_one_line_per_mismatch(
    packed: tuple[str, Path], config_file: Path
) -> None:
    url, _ = packed
    proc = cli(
        "check", url, "--trainer", "t=2.0", "--term", "cuda=12.1", "--cache-root", "/c",
        "--key", "dataset=abc", "--config", str(config_file),
    )  # fmt: skip
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    summary = proc.stderr.splitlines()[0]
    assert summary == (
        f"restorepoint: error: {url}: refused: 4 expectations not met "
        "(trainer, terms.cuda, terms.torch, cache_root)"
    )
    # Terms are a whole map: torch is recorded but was not expected. Each line names where
    # the value here came from.
    assert mismatch_lines(proc.stderr) == [
        "trainer: here t=2.0 (--trainer), in the restore point t=1.0",
        "terms.cuda: here 12.1 (--term), in the restore point 12.4",
        "terms.torch: here (absent) (--term), in the restore point 2.13.0",
        "cache_root: here /c (--cache-root), in the restore point /cache",
    ]


def test_check_refused_json(packed: tuple[str, Path]) -> None:
    url, handoff = packed
    proc = cli(
        "check", url, "--expect", str(handoff), *TERMS, "--term", "nccl=2.21",
        "--key", "dataset=xyz", "--json",
    )  # fmt: skip
    assert proc.returncode == 3
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert out["ok"] is False
    error = out["error"]
    assert error["class"] == "IncompatibleRestorePoint"
    assert error["exit_code"] == 3
    assert error["url"] == url
    assert error["mismatches"] == [
        {"field": "terms.nccl", "expected": "2.21", "source": "--term"},
        {"field": "cache_keys.dataset", "expected": "xyz", "found": "abc", "source": "--key"},
    ]
    assert mismatch_lines(proc.stderr) == [
        "terms.nccl: here 2.21 (--term), in the restore point (absent)",
        "cache_keys.dataset: here xyz (--key), in the restore point abc",
    ]


def test_check_with_nothing_known_here_refuses_every_recorded_field(
    packed: tuple[str, Path],
) -> None:
    """The strict rule: a field this machine cannot know is a refusal, never a pass."""
    proc = cli("check", packed[0], "--term", "cuda=12.4", "--term", "torch=2.13.0", "--json")
    assert proc.returncode == 3
    found = json.loads(proc.stdout)["error"]["mismatches"]
    assert [(m["field"], m.get("unknown")) for m in found] == [
        ("trainer", True), ("cache_root", True), ("cache_keys", True), ("config", True),
    ]  # fmt: skip
    assert mismatch_lines(proc.stderr)[2] == (
        "cache_keys: unknown here (give --key, --data, --expect or an adapter); "
        'in the restore point {"dataset":"abc"}'
    )


def test_handoff_then_check_and_options_override_it(packed: tuple[str, Path]) -> None:
    url, handoff = packed
    document = json.loads(handoff.read_text("utf-8"))
    assert document["handoff"] == "restorepoint-handoff/1"
    assert document["url"] == url
    proc = cli("check", url, "--expect", str(handoff))
    assert proc.returncode == 0, proc.stderr
    # The option replaces the file's value for cuda; the file's torch stays expected.
    proc = cli("check", url, "--expect", str(handoff), "--term", "cuda=other", "--json")
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["error"]["mismatches"] == [
        {"field": "terms.cuda", "expected": "other", "found": "12.4", "source": "--term"}
    ]


def test_handoff_edited_by_hand_is_a_usage_error(tmp_path: Path, packed: tuple[str, Path]) -> None:
    url, handoff = packed
    document = json.loads(handoff.read_text("utf-8"))
    document["trainer"] = "t=1.0"
    handoff.write_text(json.dumps(document), "utf-8")
    proc = cli("check", url, "--expect", str(handoff))
    assert proc.returncode == 2
    assert "trainer" in one_error_line(proc)
    proc = cli("check", url, "--expect", str(tmp_path / "missing.json"))
    assert proc.returncode == 4
    assert "handoff file not found" in one_error_line(proc)


def test_handoff_with_a_duplicate_member_is_a_usage_error(
    tmp_path: Path, packed: tuple[str, Path]
) -> None:
    # json.loads keeps the last of two equal names: a handoff saying "terms" twice was read
    # as whichever came last. The head refuses duplicates; so does the handoff now.
    url, handoff = packed
    text = handoff.read_text("utf-8").rstrip().removesuffix("}")
    doubled = tmp_path / "doubled.json"
    doubled.write_text(text + ',\n  "terms": {"cuda": "0.0"}\n}\n', "utf-8")
    assert json.loads(doubled.read_text("utf-8"))["terms"] == {"cuda": "0.0"}
    for verb in (("check", url), ("import", url, str(tmp_path / "dest"))):
        proc = cli(*verb, "--expect", str(doubled), "--json")
        assert proc.returncode == 2
        assert one_error_line(proc).endswith("not a handoff file: the member 'terms' appears twice")
        assert json.loads(proc.stdout)["error"]["class"] == "ConfigError"
    assert not (tmp_path / "dest").exists()
    # and a handoff "file" that is a FIFO is refused, not waited on
    fifo = tmp_path / "handoff.fifo"
    os.mkfifo(fifo)
    proc = cli("check", url, "--expect", str(fifo), timeout=30)
    assert proc.returncode == 2
    assert one_error_line(proc).endswith("not a regular file")


def test_config_file_in_yaml_or_toml_gives_the_identity(
    tmp_path: Path, packed: tuple[str, Path]
) -> None:
    url, _ = packed
    # Another checkpoint interval (an operational key of the restore point): compatible.
    url, handoff = packed
    others = ("--trainer", "t=1.0", *TERMS, "--key", "dataset=abc", "--cache-root", "/cache")
    toml = tmp_path / "train.toml"
    toml.write_text("lr = 0.001\n[model]\nwidth = 64\n[train]\ncheckpoint_every = 100\n")
    proc = cli("check", url, *others, "--config", str(toml))
    assert proc.returncode == 0, proc.stderr
    yaml = tmp_path / "other.yml"
    yaml.write_text(
        "lr: 0.0003\nmodel:\n  width: 64\n  depth: 2\ntrain:\n  checkpoint_every: 500\n"
    )
    proc = cli("check", url, *others, "--config", str(yaml))
    assert proc.returncode == 3
    assert mismatch_lines(proc.stderr) == [
        "config.lr: here 0.0003 (--config), in the restore point 0.001",
        "config.model.depth: here 2 (--config), in the restore point (absent)",
    ]
    # The handoff and the options are two views: the restore point must meet both.
    proc = cli("check", url, "--expect", str(handoff), "--config", str(yaml))
    assert proc.returncode == 3
    assert [line.split(":")[0] for line in mismatch_lines(proc.stderr)] == [
        "config.lr", "config.model.depth",
    ]  # fmt: skip


def test_import_check_keys_without_expectation_is_a_usage_error(
    tmp_path: Path, packed: tuple[str, Path]
) -> None:
    dest = tmp_path / "dest"
    proc = cli("import", packed[0], str(dest), "--check-keys")
    assert proc.returncode == 2
    assert "--check-keys needs at least one expectation" in one_error_line(proc)
    assert not dest.exists()


def test_import_refused_creates_no_dest(tmp_path: Path, packed: tuple[str, Path]) -> None:
    url, handoff = packed
    dest = tmp_path / "restored" / "dest"
    proc = cli(
        "import", url, str(dest), "--check-keys", "--expect", str(handoff), "--key", "dataset=z"
    )
    assert proc.returncode == 3
    assert mismatch_lines(proc.stderr) == [
        "cache_keys.dataset: here z (--key), in the restore point abc"
    ]
    assert not dest.exists()
    assert not dest.parent.exists()
    proc = cli("import", url, str(dest), "--trainer", "other=1.0", "--json")
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["error"]["mismatches"] == [
        {"field": "trainer", "expected": "other=1.0", "found": "t=1.0", "source": "--trainer"}
    ]
    assert not dest.parent.exists()


def test_import_with_the_handoff_passes(tmp_path: Path, packed: tuple[str, Path]) -> None:
    url, handoff = packed
    dest = tmp_path / "dest"
    proc = cli("import", url, str(dest), "--check-keys", "--expect", str(handoff))
    assert proc.returncode == 0, proc.stderr
    assert (dest / "model.bin").read_bytes() == bytes(range(256)) * 100
    assert (dest / "sub" / "state.json").read_text() == '{"step": 7}'


def test_local_view_shows_the_identity_the_gate_compares(
    packed: tuple[str, Path], config_file: Path
) -> None:
    """The restore point declares train.checkpoint_every operational: its config identity is
    computed without it. local-view shows that identity with --against (the restore point's
    keys) or the same --operational as the pack, and says which keys it used."""
    url, _ = packed
    recorded = read_manifest(url, head_only=True).config_identity

    def shown(*args: str) -> dict[str, Any]:
        proc = cli("local-view", "--config", str(config_file), *args, "--json")
        assert proc.returncode == 0, proc.stderr
        (fields,) = json.loads(proc.stdout)["views"]
        return next(f for f in fields if f["field"] == "config_identity")

    against = shown("--against", url)
    assert against["value"] == recorded
    assert against["operational_keys"] == ["train.checkpoint_every"]
    assert shown("--operational", "train.checkpoint_every")["value"] == recorded
    plain = shown()
    assert plain["operational_keys"] == [] and plain["value"] != recorded
    proc = cli("local-view", "--config", str(config_file), "--against", url)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert f"  config_identity  {recorded}  [--config; operational keys of {url}: " in (proc.stdout)
    assert proc.stdout.endswith("train.checkpoint_every]\n")
