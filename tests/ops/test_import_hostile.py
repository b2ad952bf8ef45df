"""import against hostile restore points and hostile destinations: nothing is ever written
outside DEST, and DEST is left as it was whenever the import is refused.

The restore points are forged with valid digests, so that the only fault is the one planted.
Each test snapshots the whole test directory (DEST, its parent, a sibling "outside" directory
that a traversal would aim at) before and after."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import DestinationError, StorageError, UnsafePath
from restorepoint.format import manifest as manifest_module
from restorepoint.ops import unpack
from restorepoint.testing.forge import ForgedEntry, Parts, assemble

NFC = "\u00e9"  # é as one code point
NFD = "e\u0301"  # é as e + combining acute


def snapshot(root: Path) -> dict[str, Any]:
    """Every name under ``root``, without following links: kind, mode, and bytes or target."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("dir", st.st_mode)
            else:
                with open(path, "rb") as f:
                    out[rel] = ("file", st.st_mode, f.read())
    return out


def forged(
    tmp_path: Path,
    entries: list[tuple[str, bytes]],
    extra: dict[str, dict[str, Any]] | None = None,
) -> str:
    """A restore point whose index lists ``entries`` in exactly this order (no sorting, no
    path checks: the forge writes what it is given), every digest and offset valid."""
    parts = Parts.sample(files={})
    parts.entries = [ForgedEntry.from_bytes(path, data) for path, data in entries]
    for entry in parts.entries:
        entry.extra = dict((extra or {}).get(entry.path, {}))
    url = str(tmp_path / "hostile.rpt")
    Path(url).write_bytes(assemble(parts))
    return url


@pytest.fixture
def scene(tmp_path: Path) -> Path:
    """tmp_path/outside (what a traversal aims at), tmp_path/out (DEST's parent)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"must stay as it is")
    (outside / "dir").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path


HOSTILE = {
    "parent": [("../x", b"up")],
    "parent-outside": [("../outside/pwned", b"up")],
    "inner-parent": [("a/../../x", b"up")],
    "dot": [("./x", b"dot")],
    "absolute": [("/etc/x", b"abs")],
    "drive": [("C:x", b"drive")],
    "backslash": [("a\\b", b"win")],
    "nul": [("a\x00b", b"nul")],
    "control": [("a\x1bb", b"esc")],
    "empty-component": [("a//b", b"empty")],
    "trailing-slash": [("a/", b"slash")],
    "duplicate": [("x", b"one"), ("x", b"two")],
    "case-folded": [("A", b"upper"), ("a", b"lower")],
    "nfc-nfd": [(NFD, b"decomposed"), (NFC, b"composed")],
    "file-and-dir": [("a", b"file"), ("a/b", b"inside")],
    "unsorted": [("b", b"b"), ("a", b"a")],
}


@pytest.mark.parametrize("existing", [False, True], ids=["absent", "force-over-existing"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_paths_are_refused(scene: Path, name: str, existing: bool) -> None:
    url = forged(scene, HOSTILE[name])
    dest = scene / "out" / "ckpt"
    if existing:
        dest.mkdir()
        (dest / "old.bin").write_bytes(b"old")
    before = snapshot(scene)
    with pytest.raises(UnsafePath) as info:
        restorepoint.import_restore_point(url, dest, force=existing)
    assert info.value.exit_code == 1
    assert snapshot(scene) == before


def test_a_claimed_symlink_is_unpacked_as_a_plain_file(scene: Path) -> None:
    claims = {"link": {"target": "/etc/passwd", "type": "symlink"}}
    url = forged(scene, [("link", b"not a link")], claims)
    # The index really carries the claim: the reader ignores fields it does not know...
    assert restorepoint.read_manifest(url).payload is not None
    dest = scene / "out" / "ckpt"
    before = snapshot(scene)
    restorepoint.import_restore_point(url, dest)
    # ...and the importer writes only regular files and directories: never a link.
    assert not os.path.islink(dest / "link")
    assert os.path.isfile(dest / "link")
    assert (dest / "link").read_bytes() == b"not a link"
    after = snapshot(scene)
    added = {k: v for k, v in after.items() if k not in before}
    assert sorted(added) == ["out/ckpt", "out/ckpt/link"]
    assert all(v[0] != "link" for v in after.values())
    assert {k: after[k] for k in before} == before


DEFENCE = [
    "parent-outside",
    "absolute",
    "absolute-into-outside",
    "duplicate",
    "case-folded",
    "nfc-nfd",
    "file-and-dir",
]


@pytest.mark.parametrize("name", DEFENCE)
def test_the_unpacker_checks_the_paths_again(
    scene: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = HOSTILE.get(name) or [(str(scene / "outside" / "pwned"), b"abs")]
    url = forged(scene, entries)
    # Without the reader's check, the hostile index is read as a valid manifest...
    monkeypatch.setattr(manifest_module, "check_paths", lambda paths: None)
    manifest = restorepoint.read_manifest(url)
    assert manifest.payload is not None
    assert [e.path for e in manifest.payload] == [p for p, _ in entries]
    # ...and the unpacker refuses it all the same, before writing anything.
    before = snapshot(scene)
    with pytest.raises(UnsafePath):
        restorepoint.import_restore_point(url, scene / "out" / "ckpt")
    assert snapshot(scene) == before


# -- links planted in the destination ----------------------------------------------------------


@pytest.fixture
def planted(scene: Path) -> Path:
    """A non-empty DEST holding links that point outside it (a directory and a file)."""
    dest = scene / "out" / "ckpt"
    dest.mkdir()
    (dest / "old.bin").write_bytes(b"old")
    (dest / "evil").symlink_to(scene / "outside")
    (dest / "evil-file").symlink_to(scene / "outside" / "secret.txt")
    return dest


def _through_the_links(scene: Path) -> str:
    entries = [("evil-file", b"overwritten?"), ("evil/pwned", b"written outside?"), ("ok", b"ok")]
    return forged(scene, entries)


def test_planted_links_without_force(scene: Path, planted: Path) -> None:
    url = _through_the_links(scene)
    before = snapshot(scene)
    with pytest.raises(DestinationError) as info:
        restorepoint.import_restore_point(url, planted)
    assert info.value.exit_code == 2
    assert snapshot(scene) == before


def test_planted_links_with_force(scene: Path, planted: Path) -> None:
    url = _through_the_links(scene)
    outside = snapshot(scene / "outside")
    restorepoint.import_restore_point(url, planted, force=True)
    kinds = {k: v[0] if v[0] == "dir" else v[0::2] for k, v in snapshot(planted).items()}
    assert kinds == {
        "evil": "dir",
        "evil/pwned": ("file", b"written outside?"),
        "evil-file": ("file", b"overwritten?"),
        "ok": ("file", b"ok"),
    }
    assert not (planted / "evil").is_symlink() and not (planted / "evil-file").is_symlink()
    assert snapshot(scene / "outside") == outside
    assert sorted(os.listdir(scene / "out")) == ["ckpt"]


# -- links planted in the staging directory while the import runs ------------------------------


def _plant_after_staging(monkeypatch: pytest.MonkeyPatch, name: str, target: Path) -> list[str]:
    """Once the staging directory exists (and before any file is written in it), plant a link
    ``name`` -> ``target`` in it, as an attacker racing the importer would."""
    planted: list[str] = []
    original = unpack._Tree.__init__

    def init(self: unpack._Tree, root: str) -> None:
        original(self, root)
        os.symlink(target, os.path.join(root, name))
        planted.append(root)

    monkeypatch.setattr(unpack._Tree, "__init__", init)
    return planted


def test_a_link_planted_in_staging_cannot_redirect_a_directory(
    scene: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = forged(scene, [("sub/file", b"where does this go?")])
    planted = _plant_after_staging(monkeypatch, "sub", scene / "outside" / "dir")
    before = snapshot(scene)
    with pytest.raises(StorageError) as info:
        restorepoint.import_restore_point(url, scene / "out" / "ckpt")
    assert planted, "the link was never planted"
    assert info.value.exit_code == 4
    message = str(info.value)
    assert os.strerror(errno.ELOOP) in message or os.strerror(errno.ENOTDIR) in message
    assert snapshot(scene) == before  # nothing outside; the staging directory removed


def test_a_link_planted_in_staging_cannot_redirect_a_file(
    scene: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = forged(scene, [("secret.txt", b"overwritten?")])
    planted = _plant_after_staging(monkeypatch, "secret.txt", scene / "outside" / "secret.txt")
    before = snapshot(scene)
    with pytest.raises(StorageError):
        restorepoint.import_restore_point(url, scene / "out" / "ckpt")
    assert planted
    assert snapshot(scene) == before
    assert (scene / "outside" / "secret.txt").read_bytes() == b"must stay as it is"
