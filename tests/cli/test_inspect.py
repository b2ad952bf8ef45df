"""The human ``inspect`` says what ``inspect --json`` says of signatures, recipients, required
features and parts, and counts a commit's files as verify does (they are in its parts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clirun import cli

from restorepoint.ops import HeadSpec, pack, verify
from restorepoint.ops.parts import CommitPlan, publish_commit, publish_part
from restorepoint.ops.spec import PackOptions
from restorepoint.trust import generate, load_public, load_signing_key


def _inspect(url: str, *extra: str) -> tuple[dict[str, str], list[str], dict[str, Any]]:
    """The human output as {label: value} and all its lines, and the --json object."""
    human = cli("inspect", url, *extra)
    assert human.returncode == 0 and human.stderr == "", human.stderr
    as_json = cli("inspect", url, *extra, "--json")
    assert as_json.returncode == 0 and as_json.stderr == "", as_json.stderr
    lines = human.stdout.splitlines()
    labelled = {line[:14].strip(): line[14:] for line in lines if not line.startswith(" ")}
    return labelled, lines, json.loads(as_json.stdout)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, list[str]]:
    """Signed by two keys, encrypted to two recipients: (url, the signers' ids, recipients)."""
    root = tmp_path_factory.mktemp("sealed")
    (root / "ckpt").mkdir()
    (root / "ckpt" / "model.bin").write_bytes(b"weights" * 100)
    signers = [generate(root / f"signer{i}", "signing")[0] for i in range(2)]
    recipients = [
        load_public(generate(root / f"to{i}", "encryption")[1], "encryption") for i in range(2)
    ]
    result = pack(
        root / "ckpt",
        root / "sealed.rp",
        position=9,
        sign=[load_signing_key(p) for p in signers],
        encrypt_to=recipients,
    )
    ids = [load_public(f"{p}.pub", "signing").key_id for p in signers]
    return result.url, ", ".join(ids), [r.key_id for r in recipients]


def test_signed_and_encrypted(sealed: tuple[str, str, list[str]]) -> None:
    url, signers, recipients = sealed
    row, _lines, data = _inspect(url)
    manifest = data["manifest"]
    assert data["signed_by"] == signers.split(", ")
    assert row["signatures"].startswith(f"valid, by {signers} ")
    stanzas = [r["keyid"] for r in manifest["encryption"]["recipients"]]
    assert sorted(stanzas) == sorted(recipients)
    assert row["encryption"] == (
        f"{manifest['encryption']['scheme']} to 2 recipients: {', '.join(stanzas)}"
    )
    assert row["features"] == ", ".join(manifest["required_features"])
    assert "encryption/1" in manifest["required_features"]
    # Read without a key: the payload table is in the index, which is not encrypted.
    assert data["files"] == len(manifest["payload"]) == 1
    assert row["payload"].startswith("1 file, ")
    assert "parts" not in row and data["parts"] == []

    # --head reads neither the signature block nor the index, and says so.
    row, _lines, data = _inspect(url, "--head")
    assert row["signatures"] == "not read (--head reads the head only)"
    assert data["signed_by"] is None and data["files"] is None
    assert row["encryption"].endswith(f": {', '.join(stanzas)}")
    assert "payload" not in row


def test_plain_and_unsigned(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    for name in ("a", "b", "c"):
        (tmp_path / "ckpt" / name).write_text(name)
    url = pack(tmp_path / "ckpt", tmp_path / "plain.rp", position=1).url
    row, _lines, data = _inspect(url)
    assert row["signatures"] == "none" and data["signed_by"] == []
    assert row["encryption"] == "none (the payload is plain)"
    assert data["manifest"]["encryption"] is None
    assert row["features"] == (", ".join(data["manifest"]["required_features"]) or "none required")
    assert row["payload"].startswith("3 files, ") and data["files"] == 3


def test_a_multi_part_commit(tmp_path: Path) -> None:
    """Two ranks and a shared part, 5 files in all: the commit itself holds none."""
    store = str(tmp_path / "store") + "/"
    spec = HeadSpec(position=12, trainer=("restorepoint.torch", "1"), run="ddp")
    plan = CommitPlan.new(2, reshardable=True)
    refs = []
    for rank, names in ((0, ["a0", "b0"]), (1, ["a1", "b1"]), (None, ["shared"])):
        where = tmp_path / f"rank{rank}"
        where.mkdir()
        for name in names:
            (where / f"{name}.pt").write_bytes(name.encode() * 300)
        refs.append(publish_part(where, store, spec, plan, rank=rank, options=PackOptions()))
    url = publish_commit(store, spec, plan, refs, PackOptions()).url

    row, lines, data = _inspect(url)
    assert data["manifest"]["payload"] == []  # the commit's own payload: none
    assert data["files"] == verify(url).files == 5
    assert row["payload"].startswith("5 files, ") and row["payload"].endswith(" in its parts")
    parts = data["manifest"]["parts"]
    assert row["parts"] == f"3 parts for world size {parts['world_size']} (reshardable)"
    read = {p["name"]: p for p in data["parts"]}
    for ref in parts["objects"]:
        rank = "shared" if ref["rank"] is None else f"rank {ref['rank']}"
        files = read[ref["name"]]["files"]
        count = f"{files} file" + ("" if files == 1 else "s")
        (line,) = [line for line in lines if line.startswith(f"  {ref['name']:<14} ")]
        assert line.startswith(f"  {ref['name']:<14} {rank:<9} {count}, ")
        assert line.endswith(f"digest {ref['digest'][:16]}")
        assert read[ref["name"]]["rank"] == ref["rank"]
    assert sorted(p["files"] for p in data["parts"]) == [1, 2, 2]
    table = lines[[line.startswith("payload") for line in lines].index(True) + 1 :]
    assert sorted(line.split()[-1] for line in table) == [
        "a0.pt", "a1.pt", "b0.pt", "b1.pt", "shared.pt",
    ]  # fmt: skip

    # A part is never a restore point on its own, but inspect shows whose part it is.
    part_url = read["rank-00001.rp"]["url"]
    row, _lines, data = _inspect(part_url)
    part = data["manifest"]["part"]
    assert row["part of"] == f"commit {part['commit']} (rank 1, world size 2)"
