"""kill -9 during pack: whatever the moment, the name holds a restore point that verifies.

A real packer process (``_packer.py``) packs ~24 MiB of random data over a destination that
already holds an older restore point, and is killed with SIGKILL after a random delay. After
each kill the destination must be byte-identical to the old restore point or to the new one
(when the kill came after the commit), and must verify; nothing else may be visible under the
final name. Left over may be only what the publish protocol allows: partial files beside the
name (local), incomplete multipart uploads (S3), each counted and cleaned up before the next
trial. Across the trials both outcomes must occur, or the kills did not cover the pack.

The delays are reproducible: set RESTOREPOINT_CRASH_SEED to replay a run (the seed is printed).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint.testing.store import payload

from . import _faults
from ._ready import spawn_ready
from ._ready import trials as kills

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RESTOREPOINT_CRASH_SEED", "20261201"))
PACKER = Path(__file__).with_name("_packer.py")
#: A packer that has published stays alive this long (a trainer goes on), so that a kill after
#: the commit is still a kill.
LINGER = 60.0
#: Delays run up to this multiple of the measured pack: the part past 1.0 lands after the
#: commit even when a trial is slower than the measured pack (a third of the kills, planned).
REACH = 1.5
FINAL = "ckpt.rp"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(old, new): a small older checkpoint and ~24 MiB of random (incompressible) data in
    files of uneven sizes, so that kills land in every phase of a file."""
    old = tmp_path_factory.mktemp("old-checkpoint")
    (old / "model.bin").write_bytes(payload(1 << 20, seed=SEED))
    new = tmp_path_factory.mktemp("new-checkpoint")
    sizes = [(8 << 20) + 1, 6 << 20, 5 << 20, (3 << 20) - 7, 2 << 20, 4097, 0]
    for i, size in enumerate(sizes):
        (new / f"shard-{i}.bin").write_bytes(payload(size, seed=SEED + 1 + i))
    return old, new


@dataclass
class Target:
    """Where the trials pack to, and how to look at it without restorepoint."""

    url: str
    env: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)

    def read(self) -> bytes:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def leftovers(self, pid: int) -> int:
        """Check what else the store holds after a kill of ``pid``; clean it up, count it."""
        raise NotImplementedError

    def mark(self) -> None:
        """Just before a packer starts."""

    def settle(self) -> None:
        """Just after it was killed: let the store finish what the packer had sent."""


@dataclass
class LocalTarget(Target):
    directory: Path = Path()

    def read(self) -> bytes:
        return (self.directory / FINAL).read_bytes()

    def write(self, data: bytes) -> None:
        (self.directory / FINAL).write_bytes(data)

    def leftovers(self, pid: int) -> int:
        partial = re.compile(rf"\.{re.escape(FINAL)}\.rp-partial-{pid}-[0-9a-f]{{12}}")
        others = sorted(n for n in os.listdir(self.directory) if n != FINAL)
        assert all(partial.fullmatch(n) for n in others), others
        for name in others:
            (self.directory / name).unlink()
        return len(others)


@dataclass
class S3Target(Target):
    client: Any = None
    bucket: str = ""
    key: str = ""
    _before: set[threading.Thread] = field(default_factory=set)

    def read(self) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=self.key)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def write(self, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data)

    def mark(self) -> None:
        self._before = set(threading.enumerate())

    def settle(self) -> None:
        # A request that reached the server before the kill still runs to its end there: a
        # CompleteMultipartUpload sent just before the kill commits just after it. Real S3
        # does the same; here the server is in this process, so wait for the threads that
        # serve the packer's connections (each ends when it reads the dead socket's EOF),
        # including one the server accepts only now from its queue.
        deadline = time.monotonic() + 30
        while True:
            time.sleep(0.05)
            serving = [
                t for t in set(threading.enumerate()) - self._before if "process_request" in t.name
            ]
            if not serving and _faults.idle():
                return
            assert time.monotonic() < deadline, "the server still serves a killed packer"
            for thread in serving:
                if thread.ident is not None:  # else still starting: look again
                    thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def leftovers(self, pid: int) -> int:
        listed = self.client.list_objects_v2(Bucket=self.bucket).get("Contents", [])
        # No completed partial object: the only object is the restore point itself.
        assert [o["Key"] for o in listed] == [self.key]
        uploads = self.client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])
        assert all(u["Key"] == self.key for u in uploads), uploads
        for u in uploads:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=u["UploadId"]
            )
        return len(uploads)


def _spawn(source: Path, target: Target, linger: float) -> subprocess.Popen[str]:
    return spawn_ready(PACKER, [str(source), target.url, str(linger)], "packer", target.env)


def _verified(target: Target) -> str:
    return restorepoint.verify(target.url, storage_options=target.options).manifest.id


def run_trials(source: Path, old_source: Path, target: Target, trials: int) -> Counter[str]:
    restorepoint.pack(old_source, target.url, position=1, storage_options=target.options)
    old = target.read()
    old_id = _verified(target)

    # Measured once, before the trials: from "ready" to the commit, the median of three runs
    # (one run alone varies by a factor of two on a busy machine).
    durations, packed = [], set()
    for _ in range(3):
        target.write(old)
        proc = _spawn(source, target, linger=0.0)
        started = time.perf_counter()
        assert proc.stdout is not None
        published = proc.stdout.readline()
        durations.append(time.perf_counter() - started)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert published.startswith("published ")
        assert target.leftovers(proc.pid) == 0
        packed.add(target.read())
    duration = sorted(durations)[1]
    # Fixed id and time: every pack of the source is the same bytes, so "new" is one object.
    assert len(packed) == 1
    new = packed.pop()
    new_id = _verified(target)
    assert new != old

    rng = random.Random(SEED)
    # Stratified: one delay drawn in each of `trials` equal slices of [0, REACH * duration],
    # so that the kills spread over the whole pack and past its commit.
    delays = [(i + rng.random()) / trials * REACH * duration for i in range(trials)]
    rng.shuffle(delays)
    print(
        f"\ncrash seed {SEED}: {type(target).__name__}, pack {duration:.3f} s, "
        f"{trials} kills in [0, {REACH * duration:.3f}] s"
    )
    outcomes: Counter[str] = Counter()
    for i, delay in enumerate(delays):
        target.write(old)
        target.mark()
        proc = _spawn(source, target, linger=LINGER)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        target.settle()
        assert proc.returncode == -signal.SIGKILL, f"trial {i}: the packer ended by itself"
        what = f"seed {SEED}, trial {i}, kill after {delay:.3f} s"
        got = target.read()
        if got == old:
            assert "published" not in out, what
            outcomes["old kept"] += 1
            assert _verified(target) == old_id, what
        else:
            assert got == new, f"{what}: neither the old nor the new restore point"
            outcomes["new published"] += 1
            assert _verified(target) == new_id, what
        outcomes["left over"] += target.leftovers(proc.pid)
    print(f"crash seed {SEED}: {dict(outcomes)}")
    assert outcomes["old kept"] > 0, f"seed {SEED}: no kill landed before the commit"
    assert outcomes["new published"] > 0, f"seed {SEED}: no kill landed after the commit"
    return outcomes


def test_kill_local_pack(sources: tuple[Path, Path], tmp_path: Path) -> None:
    old_source, source = sources
    directory = tmp_path / "store"
    directory.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
    target = LocalTarget(url=str(directory / FINAL), env=env, directory=directory)
    count = kills(24)
    outcomes = run_trials(source, old_source, target, trials=count)
    assert outcomes["old kept"] + outcomes["new published"] == count


@pytest.mark.s3
def test_kill_s3_pack(
    sources: tuple[Path, Path],
    s3_client: Any,
    s3_bucket: str,
    s3_env: dict[str, str],
    s3_storage_options: dict[str, Any],
) -> None:
    old_source, source = sources
    key = f"runs/{FINAL}"
    target = S3Target(
        url=f"s3://{s3_bucket}/{key}",
        env=s3_env,
        options=s3_storage_options,
        client=s3_client,
        bucket=s3_bucket,
        key=key,
    )
    count = kills(16)
    outcomes = run_trials(source, old_source, target, trials=count)
    assert outcomes["old kept"] + outcomes["new published"] == count
