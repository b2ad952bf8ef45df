"""The golden vectors (spec/vectors): the committed bytes are the generator's, and the library and
the CLI both give every vector its recorded outcome, every gate vector its recorded decision,
every trust vector, read with its recorded trust options, its recorded outcome, and every vector
set (a multi-part restore point laid out as a store lays it out) its recorded outcome."""

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
GATES: list[dict[str, Any]] = json.loads((VECTORS / "gate" / "index.json").read_text("utf-8"))
TRUSTS: list[dict[str, Any]] = json.loads((VECTORS / "trust" / "index.json").read_text("utf-8"))
SETS: list[dict[str, Any]] = json.loads((VECTORS / "sets" / "index.json").read_text("utf-8"))
FIELDS = {"name", "file", "valid", "expected_error", "exit_code", "fault"}
GATE_FIELDS = {
    "name", "kind", "vector", "expect", "compatible", "exit_code", "mismatches",
    "strict_compatible", "strict_exit_code", "strict_mismatches", "fault",
}  # fmt: skip
TRUST_FIELDS = FIELDS | {"kind", "trust", "require_signature", "identity"}
SET_FIELDS = (FIELDS - {"file"}) | {"kind", "commit"}
PART_FIELDS = {"name", "rank", "file", "digest", "files"}


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


def cli_verify(path: str, record: dict[str, Any]) -> dict[str, Any]:
    """``restorepoint verify PATH --json`` as the record says it ends: its exit code, one JSON
    line, no traceback; a refusal one error line of the recorded class. Returns the JSON."""
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
    out: dict[str, Any] = json.loads(lines[0])
    if record["valid"]:
        assert done.stderr == ""
        assert out["ok"] is True
        assert out["position"] == record["position"]
        return out
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("restorepoint: error: ")
    assert out["ok"] is False
    assert out["error"]["class"] == record["expected_error"]
    assert out["error"]["exit_code"] == record["exit_code"]
    return out


@pytest.mark.parametrize("record", by_name(RECORDS))
def test_cli_gives_the_recorded_outcome(record: dict[str, Any]) -> None:
    out = cli_verify(str(VECTORS / record["file"]), record)
    if record["valid"]:
        assert out["files"] == len(record["files"])


def test_gate_vectors_cover_the_gate() -> None:
    names = {r["name"] for r in GATES + RECORDS + TRUSTS}
    assert len(names) == len(GATES + RECORDS + TRUSTS)
    files = {f"gate/{p.name}" for p in (VECTORS / "gate").iterdir()} - {"gate/index.json"}
    assert {r["expect"] for r in GATES} == files
    assert {True, False} == {r["compatible"] for r in GATES}
    fields = {m["field"].split(".")[0] for r in GATES for m in r["mismatches"]}
    assert fields == {"trainer", "terms", "cache_root", "cache_keys", "config", "config_identity"}
    # The strict rule refuses each field unknown here, and passes a restore point that records
    # nothing with an empty view.
    unknown = {m["field"] for r in GATES for m in r["strict_mismatches"] if m.get("unknown")}
    assert unknown == {"trainer", "terms", "cache_root", "cache_keys", "config"}
    assert any(r["compatible"] and not r["strict_compatible"] for r in GATES)
    assert any(r["strict_compatible"] and r["name"].startswith("gate-unknown-here") for r in GATES)
    # Both absent sides occur: a name expected but not recorded, and one recorded only.
    sides = {tuple(sorted(set(m) - {"field"})) for r in GATES for m in r["mismatches"]}
    assert {("expected",), ("found",), ("expected", "found")} <= sides


@pytest.mark.parametrize("record", by_name(GATES))
def test_gate_record_is_well_formed(record: dict[str, Any]) -> None:
    assert set(record) == GATE_FIELDS
    assert record["kind"] == "gate"
    assert record["expect"].startswith("gate/") and record["expect"].endswith(".json")
    vector = next(r for r in RECORDS if r["file"] == record["vector"])
    assert vector["valid"] is True
    assert record["compatible"] is (record["mismatches"] == [])
    assert record["exit_code"] == (0 if record["compatible"] else 3)
    assert record["strict_compatible"] is (record["strict_mismatches"] == [])
    assert record["strict_exit_code"] == (0 if record["strict_compatible"] else 3)
    for m in record["mismatches"]:
        assert set(m) - {"field"} <= {"expected", "found"} and "field" in m
        assert set(m) != {"field"}
    for m in record["strict_mismatches"]:
        if m.get("unknown"):
            assert set(m) == {"field", "found", "unknown"}
        else:
            assert m in record["mismatches"]


@pytest.mark.parametrize("record", by_name(GATES))
def test_library_gate_gives_the_recorded_decision(record: dict[str, Any]) -> None:
    url = str(VECTORS / record["vector"])
    expect = restorepoint.load_expectations(VECTORS / record["expect"])
    result = restorepoint.check(url, expect, raise_on_mismatch=False)
    assert result.compatible is record["compatible"]
    assert [m.to_dict() for m in result.mismatches] == record["mismatches"]
    strict = restorepoint.check(url, expect, raise_on_mismatch=False, strict=True)
    assert strict.compatible is record["strict_compatible"]
    assert [m.to_dict() for m in strict.mismatches] == record["strict_mismatches"]


@pytest.mark.parametrize("record", by_name(GATES))
def test_cli_gate_gives_the_recorded_decision(record: dict[str, Any]) -> None:
    url = str(VECTORS / record["vector"])
    done = subprocess.run(
        [sys.executable, "-m", "restorepoint", "check", url, "--expect",
         str(VECTORS / record["expect"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    # check is the strict gate of every resume.
    assert done.returncode == record["strict_exit_code"], done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    out = json.loads(lines[0])
    if record["strict_compatible"]:
        assert done.stderr == ""
        assert out["ok"] is True
        assert out["mismatches"] == []
        return
    assert out["ok"] is False
    assert out["error"]["class"] == "IncompatibleRestorePoint"
    assert out["error"]["exit_code"] == 3
    found = out["error"]["mismatches"]
    # The CLI names where each value came from: here, the handoff file.
    assert {m.pop("source") for m in found if "source" in m} <= {"--expect"}
    assert found == record["strict_mismatches"]
    # The summary line, then one line per mismatch.
    assert len(done.stderr.splitlines()) == 1 + len(record["strict_mismatches"]), done.stderr


# -- trust vectors --------------------------------------------------------------------------


def trust_of(record: dict[str, Any]) -> restorepoint.Trust:
    from restorepoint.trust import load_identity, load_public

    identity = record["identity"]
    return restorepoint.Trust(
        trusted=tuple(load_public(VECTORS / k, "signing").raw for k in record["trust"]),
        require_signature=record["require_signature"],
        identity=load_identity(VECTORS / identity) if identity is not None else None,
    )


def trust_options(record: dict[str, Any]) -> list[str]:
    args = [arg for k in record["trust"] for arg in ("--trust", str(VECTORS / k))]
    if record["require_signature"]:
        args.append("--require-signature")
    if record["identity"] is not None:
        args += ["--identity", str(VECTORS / record["identity"])]
    return args


def test_trust_vectors_cover_signing_and_encryption() -> None:
    folder = VECTORS / "trust"
    assert {r["file"] for r in TRUSTS} == {f"trust/{p.name}" for p in folder.glob("*.rp")}
    keys = {f"trust/keys/{p.name}" for p in (folder / "keys").iterdir()}
    used = {k for r in TRUSTS for k in r["trust"]} | {r["identity"] for r in TRUSTS} - {None}
    assert used <= keys
    # Every private key has its public key beside it, and nothing else is there.
    assert keys == {k for k in keys if not k.endswith(".pub")} | {
        f"{k}.pub" for k in keys if not k.endswith(".pub")
    }
    classes = [r["expected_error"] for r in TRUSTS]
    assert classes.count(None) == 3
    assert {"SignatureError", "DecryptionError"} == set(classes) - {None}
    # Test-only keys, said so where a reader of the directory will look.
    assert "test keys" in (VECTORS / "README.md").read_text("utf-8")


@pytest.mark.parametrize("record", by_name(TRUSTS))
def test_trust_record_is_well_formed(record: dict[str, Any]) -> None:
    extra = {"position", "files"} if record["valid"] else set()
    assert set(record) == TRUST_FIELDS | extra
    assert record["kind"] == "trust"
    assert record["name"].startswith("trust-")
    assert record["file"] == f"trust/{record['name'].removeprefix('trust-')}.rp"
    assert record["exit_code"] == (
        0 if record["valid"] else getattr(errors, record["expected_error"]).exit_code
    )
    assert not record["require_signature"] or record["trust"]
    for key in record["trust"]:
        assert key.startswith("trust/keys/") and key.endswith(".pub")


@pytest.mark.parametrize("record", by_name(TRUSTS))
def test_library_gives_the_recorded_trust_outcome(record: dict[str, Any]) -> None:
    path = str(VECTORS / record["file"])
    trust = trust_of(record)
    if record["valid"]:
        report = restorepoint.verify(path, trust=trust)
        assert report.manifest.position.to_dict() == record["position"]
        assert {e.path: e.sha256 for e in report.manifest.payload or []} == record["files"]
        if record["trust"]:
            assert report.trusted_by == report.signed_by != ()
        return
    with pytest.raises(errors.RestorePointError) as info:
        restorepoint.verify(path, trust=trust)
    assert errors.error_class(info.value) == record["expected_error"], str(info.value)
    assert info.value.url == path


@pytest.mark.parametrize("record", by_name(TRUSTS))
def test_cli_gives_the_recorded_trust_outcome(record: dict[str, Any]) -> None:
    path = str(VECTORS / record["file"])
    done = subprocess.run(
        [sys.executable, "-m", "restorepoint", "verify", path, *trust_options(record), "--json"],
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
        assert out["encrypted"] is (record["identity"] is not None)
        return
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert out["ok"] is False
    assert out["error"]["class"] == record["expected_error"]
    assert out["error"]["exit_code"] == record["exit_code"]


# -- vector sets ----------------------------------------------------------------------------


def set_folder(record: dict[str, Any]) -> Path:
    return VECTORS / "sets" / str(record["name"]).removeprefix("set-")


def test_sets_cover_multipart_commits() -> None:
    everything = RECORDS + GATES + TRUSTS + SETS
    assert len({r["name"] for r in everything}) == len(everything)
    folders = {p.name for p in (VECTORS / "sets").iterdir() if p.is_dir()}
    assert {set_folder(r).name for r in SETS} == folders
    classes = [r["expected_error"] for r in SETS]
    assert classes.count(None) == 2
    assert {"IntegrityError", "DigestMismatch", "UnsafePath"} == set(classes) - {None}
    # One valid set with a shared part, one without.
    shared = [any(p["rank"] is None for p in r["parts"]) for r in SETS if r["valid"]]
    assert sorted(shared) == [False, True]


@pytest.mark.parametrize("record", by_name(SETS))
def test_set_record_is_well_formed(record: dict[str, Any]) -> None:
    extra = {"position", "parts"} if record["valid"] else set()
    assert set(record) == SET_FIELDS | extra
    assert record["kind"] == "set"
    assert record["name"].startswith("set-")
    folder = f"sets/{record['name'].removeprefix('set-')}/"
    assert record["commit"].startswith(folder) and record["commit"].endswith(".rp")
    assert record["exit_code"] == (
        0 if record["valid"] else getattr(errors, record["expected_error"]).exit_code
    )
    stem = record["commit"].removesuffix(".rp")
    for part in record.get("parts", []):
        assert set(part) == PART_FIELDS
        rank = part["rank"]
        assert part["name"] == ("shared.rp" if rank is None else f"rank-{rank:05d}.rp")
        assert part["file"] == f"{stem}.parts/{part['name']}"
        assert (VECTORS / part["file"]).is_file()


@pytest.mark.parametrize("record", by_name(SETS))
def test_set_is_laid_out_as_a_store(record: dict[str, Any]) -> None:
    # The folder is a store: its listing holds the commit, one restore point, and no part.
    entries = restorepoint.list_store(str(set_folder(record)) + "/")
    assert [Path(e.url) for e in entries] == [VECTORS / record["commit"]]


@pytest.mark.parametrize("record", by_name(SETS))
def test_library_gives_the_recorded_set_outcome(record: dict[str, Any]) -> None:
    path = str(VECTORS / record["commit"])
    if record["valid"]:
        report = restorepoint.verify(path)
        assert report.manifest.position.to_dict() == record["position"]
        assert report.manifest.payload == ()  # a commit's files are its parts'
        assert [
            {
                "name": Path(p.url).name,
                "rank": p.manifest.part.rank if p.manifest.part else "no part member",
                "file": Path(p.url).relative_to(VECTORS).as_posix(),
                "digest": p.digest,
                "files": {e.path: e.sha256 for e in p.manifest.payload or ()},
            }
            for p in report.parts
        ] == record["parts"]
        assert report.files == sum(len(p["files"]) for p in record["parts"])
        return
    with pytest.raises(errors.RestorePointError) as info:
        restorepoint.verify(path)
    assert errors.error_class(info.value) == record["expected_error"], str(info.value)
    # The error names the commit, or the part of it that is at fault.
    url = info.value.url or ""
    assert url == path or url.startswith(path.removesuffix(".rp") + ".parts/"), url


@pytest.mark.parametrize("record", by_name(SETS))
def test_cli_gives_the_recorded_set_outcome(record: dict[str, Any]) -> None:
    out = cli_verify(str(VECTORS / record["commit"]), record)
    if record["valid"]:
        assert out["files"] == sum(len(p["files"]) for p in record["parts"])
        assert [(p["rank"], p["digest"]) for p in out["parts"]] == [
            (p["rank"], p["digest"]) for p in record["parts"]
        ]


# -- chains: incremental restore points ------------------------------------------------------

CHAINS: list[dict[str, Any]] = json.loads((VECTORS / "chains" / "index.json").read_text("utf-8"))


def test_chains_cover_incremental_restore_points() -> None:
    everything = RECORDS + GATES + TRUSTS + SETS + CHAINS
    assert len({r["name"] for r in everything}) == len(everything)
    classes = [r["expected_error"] for r in CHAINS]
    assert classes.count(None) == 3
    assert {"IntegrityError", "MalformedManifest", "FramingError", "DigestMismatch"} <= set(classes)
    # The run's prefix holds every restore point a record names, and nothing else but the two
    # bases (an object's, and a commit whose parts are bases, spec 28.7); the faulty parts
    # (verified on their own) lie under parts prefixes, where no listing sees them.
    files = {VECTORS / r["file"] for r in CHAINS}
    listed = {Path(e.url) for e in restorepoint.list_store(str(VECTORS / "chains") + "/")}
    assert {f for f in files if ".parts/" not in str(f)} < listed
    assert len(listed - files) == 2
    assert sum(".parts/" in str(f) for f in files) == 3


@pytest.mark.parametrize("record", by_name(CHAINS))
def test_library_gives_the_recorded_chain_outcome(record: dict[str, Any]) -> None:
    path = str(VECTORS / record["file"])
    if record["valid"]:
        report = restorepoint.verify(path)
        assert report.manifest.position.to_dict() == record["position"]
        # A commit's files, and its bases, are its parts' (spec 28.7).
        manifests = [report.manifest, *(p.manifest for p in report.parts)]
        assert {e.path: e.sha256 for m in manifests for e in m.payload or ()} == record["files"]
        assert all(m.bases for m in manifests[1 if report.parts else 0 :])
    else:
        with pytest.raises(restorepoint.RestorePointError) as caught:
            restorepoint.verify(path)
        assert errors.error_class(caught.value) == record["expected_error"]
