"""The golden vectors (spec/vectors): the committed bytes are the generator's, and the library and
the CLI both give every vector its recorded outcome."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import errors

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"
RECORDS: list[dict[str, Any]] = json.loads((VECTORS / "index.json").read_text("utf-8"))
FIELDS = {"name", "file", "valid", "expected_error", "exit_code", "fault"}


def by_name(records: list[dict[str, Any]]) -> list[Any]:
    return [pytest.param(r, id=r["name"]) for r in records]


def test_generator_check_passes() -> None:
    done = subprocess.run(
        [sys.executable, str(VECTORS / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_index_covers_every_family() -> None:
    names = {r["name"] for r in RECORDS}
    assert len(names) == len(RECORDS)
    assert {r["file"] for r in RECORDS} == {p.name for p in VECTORS.glob("*.rp")}
    classes = {r["expected_error"] for r in RECORDS}
    assert None in classes
    assert {"NotARestorePoint", "TruncatedRestorePoint", "UnsafePath", "DecodeError"} <= classes


@pytest.mark.parametrize("record", by_name(RECORDS))
def test_record_is_well_formed(record: dict[str, Any]) -> None:
    extra = {"position", "files"} if record["valid"] else set()
    assert set(record) == FIELDS | extra
    assert record["file"] == f"{record['name']}.rp"
    if record["valid"]:
        assert record["expected_error"] is None
        assert record["exit_code"] == 0
    else:
        cls = getattr(errors, record["expected_error"])
        assert issubclass(cls, errors.RestorePointError)
        assert record["exit_code"] == cls.exit_code


@pytest.mark.parametrize("record", by_name(RECORDS))
def test_library_gives_the_recorded_outcome(record: dict[str, Any]) -> None:
    path = str(VECTORS / record["file"])
    if record["valid"]:
        report = restorepoint.verify(path)
        assert report.manifest.position.to_dict() == record["position"]
        assert report.manifest.payload is not None
        # verify() has checked every file against these digests; they must be the recorded ones.
        assert {e.path: e.sha256 for e in report.manifest.payload} == record["files"]
        assert report.files == len(record["files"])
        return
    with pytest.raises(errors.RestorePointError) as info:
        restorepoint.verify(path)
    assert errors.error_class(info.value) == record["expected_error"], str(info.value)
    assert info.value.url == path


@pytest.mark.parametrize("record", by_name(RECORDS))
def test_cli_gives_the_recorded_outcome(record: dict[str, Any]) -> None:
    path = str(VECTORS / record["file"])
    done = subprocess.run(
        [sys.executable, "-m", "restorepoint", "verify", path, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == record["exit_code"], done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    out = json.loads(lines[0])
    if record["valid"]:
        assert done.stderr == ""
        assert out["ok"] is True
        assert out["position"] == record["position"]
        assert out["files"] == len(record["files"])
        return
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("restorepoint: error: ")
    assert out["ok"] is False
    assert out["error"]["class"] == record["expected_error"]
    assert out["error"]["exit_code"] == record["exit_code"]
