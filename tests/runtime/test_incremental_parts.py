"""Incremental multi-part restore points on moto's S3 (spec sections 25 and 28.7): two CPU
ranks over gloo (real processes), each with a frozen backbone of its own, publish a restore
point every step with ResumableRun(incremental=True). Every later part of a rank uploads at
most 12% of that rank's full part, and references only its own rank's part of the first
commit; a fresh 2-rank resume is bit for bit; prune --keep-last 1 keeps the commit whose
parts are the bases, and every kept one verifies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from clirun import cli  # noqa: E402

from restorepoint.ops import list_store, read_manifest, verify  # noqa: E402

from . import _incremental_rank as worker  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.slow]
WORLD = 2


def ranks(work: Path, phase: str, store: str, env: dict[str, str]) -> list[list[str]]:
    """Every rank of one job, each with a node directory of its own: what each printed."""
    env = dict(env)
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo picks an interface by the host name otherwise
    init = f"file://{work / f'rendezvous-{phase}'}"
    procs = []
    for r in range(WORLD):
        node, out = work / phase / f"node{r}", work / f"{phase}-{r}.pt"
        cmd = [sys.executable, worker.__file__, phase, str(r), str(WORLD), init, store]
        procs.append(
            subprocess.Popen(
                [*cmd, str(node), str(out)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            outs.append(out.splitlines())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def test_each_rank_uploads_what_changed_of_its_part_and_resumes_bit_for_bit(
    tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any], s3_env: dict[str, str]
) -> None:
    opts, store = s3_storage_options, f"s3://{s3_bucket}/runs/"
    trained = ranks(tmp_path, "train", store, s3_env)
    run_id = trained[0][-1].split()[-1]
    commits = sorted(list_store(store, run=run_id, storage_options=opts), key=lambda e: e.step)
    assert [e.step for e in commits] == list(range(1, worker.POINTS + 1))

    def parts(url: str) -> dict[str, Any]:
        manifest = read_manifest(url, storage_options=opts)
        assert manifest.parts is not None
        return {ref.name: ref for ref in manifest.parts.objects}

    first = parts(commits[0].url)
    own = [f"rank-{r:05d}.rp" for r in range(WORLD)]
    ratios = {}
    for commit in commits[1:]:
        for name, ref in parts(commit.url).items():
            url = f"{commit.url.removesuffix('.rp')}.parts/{name}"
            bases = read_manifest(url, storage_options=opts).bases or ()
            if name in own:
                # Its own rank's part of the first commit: the frozen frames lie there.
                assert [b.name for b in bases] == [
                    f"{commits[0].name.removesuffix('.rp')}.parts/{name}"
                ]
                ratios[(commit.step, name)] = round(ref.size / first[name].size, 4)
    sizes = {name: ref.size for name, ref in parts(commits[-1].url).items()}
    full = {name: ref.size for name, ref in first.items()}
    print(f"bytes per incremental part / the rank's full part: {ratios}; {sizes} / {full}")
    assert ratios and all(r <= 0.12 for r in ratios.values()), ratios

    # Two fresh nodes resume from the newest, each rank its own state, bit for bit.
    resumed = ranks(tmp_path, "resume", store, s3_env)
    assert [out[-1].split()[:2] for out in resumed] == [["step", str(worker.POINTS)]] * WORLD
    for r in range(WORLD):
        want = torch.load(tmp_path / f"train-{r}.pt", weights_only=True)
        got = torch.load(tmp_path / f"resume-{r}.pt", weights_only=True)
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want)

    # keep-last 1 keeps the newest and the first commit, whose parts its parts reference.
    proc = cli("prune", store, "--keep-last", "1", env=s3_env)
    assert proc.returncode == 0, proc.stderr
    kept = list_store(store, run=run_id, storage_options=opts)
    assert sorted(e.step for e in kept) == [1, worker.POINTS]
    for entry in kept:
        assert len(verify(entry.url, storage_options=opts).parts) >= WORLD


def test_a_full_fine_tunes_parts_name_no_chunks_from_the_first_commit(
    tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any], s3_env: dict[str, str]
) -> None:
    # Every layer trained with Adam on each rank: each rank's publisher knows from its
    # optimizer that nothing of a part is left in the next, and its parts name no chunks from
    # the run's first commit on (spec 28.4, 28.7), as one process's restore points do.
    from restorepoint.format.delta import DELTA_FEATURE

    opts, store = s3_storage_options, f"s3://{s3_bucket}/full/"
    trained = ranks(tmp_path, "full", store, s3_env)
    run_id = trained[0][-1].split()[-1]
    commits = sorted(list_store(store, run=run_id, storage_options=opts), key=lambda e: e.step)
    assert [e.step for e in commits] == list(range(1, worker.POINTS + 1))
    for commit in commits:
        manifest = read_manifest(commit.url, storage_options=opts)
        assert manifest.parts is not None
        for ref in manifest.parts.objects:
            url = f"{commit.url.removesuffix('.rp')}.parts/{ref.name}"
            part = read_manifest(url, storage_options=opts)
            assert DELTA_FEATURE not in part.required_features, (commit.step, ref.name)
