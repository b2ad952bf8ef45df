"""Copying incremental restore points to another store (spec 28.3, docs/cli.md "Copying a chain
to another store"): a whole run's prefix copied object for object keeps every chain, because a
base is named relative to the run; one incremental restore point copied without its bases does
not verify (one line naming the base), and a materialized copy of it goes anywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest
from clirun import cli, one_error_line

from restorepoint.ops import import_restore_point, latest, list_store, verify
from restorepoint.ops.publish import HeadSpec, PackOptions, PublishResult, publish

MIB = 1 << 20


def _publish(src: Path, store: str, step: int, frozen: bytes, trained: bytes) -> PublishResult:
    src.mkdir(exist_ok=True)
    (src / "model.bin").write_bytes(frozen + trained)
    (src / "state.json").write_text(json.dumps({"step": step}))
    options = PackOptions(incremental=True, chunk_size=MIB, codec="none")
    return publish(str(src), store, HeadSpec(position=step, run="r1"), options)


@pytest.mark.s3
def test_a_run_prefix_copied_to_s3_keeps_its_chains_and_one_object_alone_does_not(
    tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any], s3_env: dict[str, str]
) -> None:
    frozen = os.urandom(6 * MIB)
    src = tmp_path / "src"
    store = tmp_path / "store"
    trained = os.urandom(MIB)
    published = [_publish(src, f"{store}/", 1, frozen, os.urandom(MIB))]
    published += [_publish(src, f"{store}/", step, frozen, trained) for step in (2, 3)]
    newest = published[-1]  # frozen from the first, trained from the second: two bases
    assert newest.manifest.bases is not None and len(newest.manifest.bases) == 2

    # The documented copy: the run's prefix, object for object, with any tool (here fsspec).
    s3 = fsspec.filesystem("s3", **s3_storage_options)
    s3.put(str(store / "r1"), f"{s3_bucket}/copied/", recursive=True)
    copied = f"s3://{s3_bucket}/copied/"
    names = [e.name for e in list_store(copied, storage_options=s3_storage_options)]
    assert names == sorted((p.url.split("/store/")[1] for p in published), reverse=True)
    found = latest(copied, run="r1", verify_it=True, storage_options=s3_storage_options)
    assert found.name == newest.url.split("/store/")[1]
    dest = tmp_path / "restored"
    import_restore_point(copied + found.name, dest, storage_options=s3_storage_options)
    for name in ("model.bin", "state.json"):
        assert (dest / name).read_bytes() == (src / name).read_bytes()
    # The CLI reads the copy as well (its digest is the one the publish printed).
    proc = cli("verify", copied + found.name, "--json", env=s3_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["digest"] == newest.pack.digest

    # One incremental restore point copied alone: its bases are not beside it.
    alone = tmp_path / "alone" / "r1"
    alone.mkdir(parents=True)
    name = newest.url.split("/store/")[1]
    (alone / Path(name).name).write_bytes((store / name).read_bytes())
    proc = cli("verify", str(alone / Path(name).name))
    assert proc.returncode == 1
    assert "base r1/" in one_error_line(proc)
    assert "is missing" in one_error_line(proc)

    # materialize first, then the copy goes anywhere and verifies on its own.
    whole = tmp_path / "whole.rp"
    proc = cli("materialize", str(store / name), str(whole))
    assert proc.returncode == 0, proc.stderr
    s3.put(str(whole), f"{s3_bucket}/anywhere/whole.rp")
    report = verify(f"s3://{s3_bucket}/anywhere/whole.rp", storage_options=s3_storage_options)
    assert report.bytes == 7 * MIB + len(json.dumps({"step": 3}))
