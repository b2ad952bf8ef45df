"""Sharded state through torch.distributed.checkpoint (restorepoint.runtime.sharded): two gloo
ranks on the CPU, each with a node directory of its own, save a DTensor sharded across them with
DCP and publish their files as the parts of one restore point (rank 0's .metadata the shared
part); fresh nodes import, each rank what it needs, and DCP loads the same values back. One
process loads it too, on another world size: the state is reshardable, so it imports every part
and DCP reshards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from restorepoint.ops import list_store, verify  # noqa: E402

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("_dcp_worker.py")


def _ranks(phase: str, world: int, tmp: Path, store: str, root: Path, *extra: str) -> list[str]:
    env = dict(os.environ)
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    init = f"file://{tmp / f'rendezvous-{phase}'}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                phase,
                str(r),
                str(world),
                init,
                store,
                str(root),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_dcp_save_publish_import_load(tmp_path: Path) -> None:
    store = f"{tmp_path / 'store'}/"
    outs = _ranks("save", 2, tmp_path, store, tmp_path / "a")
    urls = {line.split()[1] for out in outs for line in out.splitlines() if line.startswith("url")}
    assert len(urls) == 1  # every rank was told the one commit
    (url,) = urls
    assert [e.url for e in list_store(store)] == [url]
    report = verify(url)
    assert report.manifest.parts is not None
    assert report.manifest.parts.reshardable
    names = {
        p.manifest.part.rank: [e.path for e in p.manifest.payload or ()]
        for p in report.parts
        if p.manifest.part
    }
    assert names == {0: ["__0_0.distcp"], 1: ["__1_0.distcp"], None: [".metadata"]}
    # Fresh nodes: each rank imports the metadata and its own shard, and DCP loads it.
    outs = _ranks("load", 2, tmp_path, store, tmp_path / "b", url)
    files = [line for out in outs for line in out.splitlines() if line.startswith("files")]
    assert files == ["files .metadata __0_0.distcp", "files .metadata __1_0.distcp"]
    # One process, another world size: every part, resharded by DCP.
    (out,) = _ranks("load1", 1, tmp_path, store, tmp_path / "c", url)
    assert "files .metadata __0_0.distcp __1_0.distcp" in out
    assert out.strip().endswith("ok")
