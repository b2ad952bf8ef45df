"""Nothing a restore point or a store holds reaches the terminal raw. Terms, trainer names, the
cache root, feature names, payload paths and listed names are anyone's who can write the
object or the store; printed raw, ESC]0;...BEL retitles the terminal, ESC[2J clears it, CR and
bidi overrides rewrite a line. Every verb prints through one escaping helper
(restorepoint/_text.py, used by restorepoint/_cli/_common.py), and --json stays JSON, with the very
same values."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from clirun import cli

import restorepoint
from restorepoint.testing.forge import ForgedEntry, Parts, assemble

#: A window title, a clear screen, a carriage return, an 8-bit CSI, a right-to-left override.
EVIL = "\x1b]0;pwned\x07\x1b[2J\rok\x9b31m\u202eevil"
#: How the CLI prints it.
ESCAPED = "\\x1b]0;pwned\\x07\\x1b[2J\\x0dok\\x9b31m\\u202eevil"


def clean(text: str) -> bool:
    """Only printable characters, and lines that end in "\\n" alone."""
    return text.replace("\n", "").isprintable()


def forged(tmp_path: Path, name: str, parts: Parts) -> str:
    path = tmp_path / name
    path.write_bytes(assemble(parts))
    return str(path)


@pytest.fixture
def hostile(tmp_path: Path) -> str:
    """A sound restore point whose head is full of control characters."""
    parts = Parts.sample(
        terms={"torch": EVIL, EVIL: "2"},
        trainer={"name": EVIL, "version": EVIL},
        cache_root=EVIL,
        cache_keys={"dataset": EVIL},
        producer={"name": EVIL, "version": "1"},
    )
    return forged(tmp_path, "hostile.rp", parts)


def test_check_escapes_what_the_head_says(hostile: str) -> None:
    proc = cli("check", hostile, "--term", "torch=2.13.0", "--trainer", "t=1", "--json")
    assert proc.returncode == 3
    assert clean(proc.stderr) and clean(proc.stdout)
    assert f"restorepoint:   terms.torch: here 2.13.0 (--term), in the restore point {ESCAPED}" in (
        proc.stderr.splitlines()
    )
    # the data is exact, as JSON
    mismatches = json.loads(proc.stdout)["error"]["mismatches"]
    found = {m["field"]: m.get("found") for m in mismatches}
    assert found["terms.torch"] == EVIL
    assert found["trainer"] == f"{EVIL}={EVIL}"


def test_inspect_escapes_every_field(hostile: str) -> None:
    proc = cli("inspect", hostile)
    assert proc.returncode == 0, proc.stderr
    assert clean(proc.stdout)
    lines = proc.stdout.splitlines()
    assert len(lines) == 17  # no value broke its line
    assert f"trainer       {ESCAPED} {ESCAPED}" in lines
    for field in ("cache root", "cache keys", "terms", "producer"):
        assert "\\x1b]0;pwned" in next(line for line in lines if line.startswith(field))
    proc = cli("inspect", hostile, "--json")
    assert proc.returncode == 0 and clean(proc.stdout)
    manifest = json.loads(proc.stdout)["manifest"]
    assert manifest["trainer"] == {"name": EVIL, "version": EVIL}
    assert manifest["cache_root"] == EVIL and manifest["terms"][EVIL] == "2"


def test_verify_escapes_an_unknown_feature_name(tmp_path: Path) -> None:
    url = forged(tmp_path, "feature.rp", Parts.sample(required_features=[EVIL]))
    for args in (("verify", url), ("inspect", url, "--head"), ("check", url, "--term", "a=b")):
        proc = cli(*args, "--json")
        assert proc.returncode == 1
        assert clean(proc.stderr) and clean(proc.stdout)
        assert "unknown required feature: \\x1b]0;pwned" in proc.stderr
        assert json.loads(proc.stdout)["error"]["class"] == "UnsupportedFormat"


def test_import_escapes_a_payload_path(tmp_path: Path) -> None:
    # C1 controls are allowed in paths (rule 4 refuses C0 and DEL only): the error naming the
    # file must not pass them on. The digest is wrong so that the path is named.
    path = "model\x9b2J\u202e.pt"
    parts = Parts.sample(files={})
    parts.entries = [ForgedEntry.from_bytes(path, b"weights")]
    parts.entries[0].extra["sha256"] = hashlib.sha256(b"other").hexdigest()
    url = forged(tmp_path, "path.rp", parts)
    for args in (("import", url, str(tmp_path / "dest")), ("verify", url)):
        proc = cli(*args, "--json")
        assert proc.returncode == 1
        assert clean(proc.stderr) and clean(proc.stdout)
        assert "model\\x9b2J\\u202e.pt" in proc.stderr
        assert json.loads(proc.stdout)["error"]["member"] == path
    assert not (tmp_path / "dest").exists()
    parts.entries[0].extra.clear()
    good = forged(tmp_path, "good.rp", parts)
    assert cli("inspect", good).stdout.count("model\\x9b2J\\u202e.pt") == 1
    proc = cli("import", good, str(tmp_path / "dest"), "--json")
    assert proc.returncode == 0 and clean(proc.stdout)
    assert json.loads(proc.stdout)["files"] == [str(tmp_path / "dest" / path)]


def test_store_verbs_escape_what_the_store_lists(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a").write_bytes(b"a")
    store = tmp_path / "store"
    published = restorepoint.pack(source, f"{store}/", position=1, run="r").url
    # A leftover-looking name anyone with write access to the store can plant.
    planted = store / "r" / f".{EVIL}.rp-partial-99999999999-0123456789ab"
    planted.write_bytes(b"x")
    os.utime(planted, (1_000_000, 1_000_000))
    for as_json in ((), ("--json",)):
        proc = cli("fsck", str(store), *as_json)
        assert proc.returncode == 1  # the planted leftover is a defect
        assert clean(proc.stdout) and clean(proc.stderr)
    assert (
        f"{store}/r/.{ESCAPED}.rp-partial-99999999999-0123456789ab"
        in cli("fsck", str(store)).stdout
    )
    for args in (
        ("list", str(store)),
        ("latest", str(store)),
        ("prune", str(store), "--keep-last", "1", "--dry-run"),
        ("prune", str(store), "--keep-last", "1"),
    ):
        proc = cli(*args)
        assert proc.returncode == 0, proc.stderr
        assert clean(proc.stdout) and clean(proc.stderr)
    assert f"deleted {store}/r/.{ESCAPED}.rp-partial-99999999999-0123456789ab  (leftover)" in (
        proc.stdout.splitlines()
    )
    assert not planted.exists() and Path(published).exists()
