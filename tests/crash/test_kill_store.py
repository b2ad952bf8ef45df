"""kill -9 during pack into a store and during prune: a store never loses the last good restore
point of a run, never touches another run, and the next prune finishes the job.

A real worker process (``_store_worker.py``) is killed with SIGKILL after a random delay, on a
local store and on S3 (moto's server, through s3fs). Two scenarios:

- **pack into a store, keep-last 1** (``publish_into_store``, the seed workflow): the store
  holds 1 to 3 complete restore points of run r1 and one of run r2; the worker packs ~18 MiB as
  r1's newest, then prunes r1. After each kill: r1 still has a listed restore point, and its
  newest listed one verifies (the new one, or the old newest); old ones are gone only once the
  new one is published, and oldest first; r2's is byte-identical; nothing partial is listed. A
  prune with grace 0 (the worker is dead, so no leftover is a live upload) then leaves exactly
  r1's newest, which verifies, and no leftover: no partial file, no incomplete upload.
- **prune, keep-last 2**: the store holds 6 to 10 restore points of r1 (the newest ~24 MiB: its
  verification comes before any deletion and takes measurable time) and r2's. After each kill:
  the 2 newest are byte-identical and verify, the deleted ones are the oldest, r2's is
  byte-identical; a second prune leaves exactly the 2 newest.

Across the trials the outcomes on both sides of each commit point must occur, or the kills did
not cover the operation. The kill points, as fractions of the operation's measured duration,
are reproducible: set RESTOREPOINT_CRASH_SEED to replay a run (the seed is printed, with one
line of outcome counts per scenario and store).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import restorepoint
from restorepoint.testing.store import payload

from . import _faults
from ._ready import spawn_ready, trials

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RESTOREPOINT_CRASH_SEED", "20261222"))
WORKER = Path(__file__).with_name("_store_worker.py")
#: A worker that has finished stays alive this long (a trainer goes on), so that a kill after
#: the operation is still a kill.
LINGER = 60.0
#: Delays run up to this multiple of the measured operation: the part past 1.0 lands after its
#: end even when a trial is slower than the measured one.
REACH = 1.5
#: Kills aimed at an outcome that the spread ones missed (``run_pack_trials``).
AIMED = 8
LOCAL_TRIALS = trials(24)
S3_TRIALS = trials(16)
R1, R2 = "r1", "r2"  # r1: the run _store_worker.py packs and prunes
#: Second newest and newest of r1 in the prune scenario; the older ones are steps 1 to 8.
SECOND_STEP, NEWEST_STEP = 99, 100

Objects = dict[str, bytes]  # store name -> bytes


# -- the restore points the trials start from ----------------------------------------------


@dataclass(frozen=True)
class Templates:
    source: Path  # what the pack worker packs: ~18 MiB, more than one S3 part
    olds: list[tuple[str, bytes]]  # r1, steps 1 to 8, small, oldest first
    second: tuple[str, bytes]  # r1, step 99, small
    newest: tuple[str, bytes]  # r1, step 100, ~24 MiB
    other: tuple[str, bytes]  # r2's only restore point


def _packed(src: Path, store: Path, step: int, run: str) -> tuple[str, bytes]:
    result = restorepoint.pack(src, f"{store}/", position=step, run=run, chunk_size=65536)
    name = Path(result.url).relative_to(store).as_posix()
    return name, Path(result.url).read_bytes()


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    """Random (incompressible) data in files of uneven sizes, so that kills land in every
    phase of a file; each restore point packed once, then copied into the store per trial."""
    source = tmp_path_factory.mktemp("source")
    sizes = [(7 << 20) + 1, 5 << 20, 3 << 20, (2 << 20) - 7, 1 << 20, 4097, 0]
    for i, size in enumerate(sizes):
        (source / f"shard-{i}.bin").write_bytes(payload(size, seed=SEED + 1 + i))
    store = tmp_path_factory.mktemp("template-store")

    def small(step: int, run: str) -> tuple[str, bytes]:
        src = tmp_path_factory.mktemp(f"{run}-{step}")
        (src / "model.bin").write_bytes(payload(40_000 + step, seed=SEED + 100 + step))
        return _packed(src, store, step, run)

    big = tmp_path_factory.mktemp("big")
    for i in range(3):
        (big / f"part-{i}.bin").write_bytes(payload(8 << 20, seed=SEED + 200 + i))
    return Templates(
        source=source,
        olds=[small(step, R1) for step in range(1, 9)],
        second=small(SECOND_STEP, R1),
        newest=_packed(big, store, NEWEST_STEP, R1),
        other=small(3, R2),
    )


# -- stores, and how to look at them without restorepoint ---------------------------------


@dataclass
class Store:
    env: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)
    url: str = ""  # the store now in use; ends in "/"

    def use(self, tag: str) -> None:
        """Switch to a fresh, empty store. Names repeat from trial to trial, and a request a
        killed worker sent may reach the server after the kill: it must never land in the
        next trial's store."""
        raise NotImplementedError

    def names(self) -> list[str]:
        """Every object under the store, partial names included, sorted."""
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        raise NotImplementedError

    def write(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def uploads(self) -> list[str]:
        """Names of incomplete uploads under the store."""
        return []

    def mark(self) -> None:
        """Just before a worker starts."""

    def settle(self) -> None:
        """Just after it was killed: let the store finish what the worker had sent."""

    def fill(self, tag: str, objects: Objects) -> None:
        self.use(tag)
        for name, data in objects.items():
            self.write(name, data)
        assert self.names() == sorted(objects)
        assert self.uploads() == []


@dataclass
class LocalStore(Store):
    root: Path = Path()
    directory: Path = Path()

    def use(self, tag: str) -> None:
        if self.url:
            self.clear()
        self.directory = self.root / tag
        self.directory.mkdir()
        self.url = f"{self.directory}/"

    def names(self) -> list[str]:
        out = []
        for dirpath, _, filenames in os.walk(self.directory):
            for name in filenames:
                out.append(Path(dirpath, name).relative_to(self.directory).as_posix())
        return sorted(out)

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def write(self, name: str, data: bytes) -> None:
        path = self.directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def clear(self) -> None:
        shutil.rmtree(self.directory)


#: /proc/net/tcp states of a client socket whose server end is still open: FIN_WAIT1,
#: FIN_WAIT2, CLOSING (and ESTABLISHED, for an instant after the kill).
_OPEN_STATES = {"01", "04", "05", "0B"}


def unfinished_connections(port: int) -> int | None:
    """Connections to ``port`` that no process owns (inode 0: a killed process's orphans)
    and that the server has not closed yet: requests it has not finished, or not even
    accepted. None where the kernel does not say (not Linux)."""
    count, seen = 0, False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        seen = True
        for row in rows:
            fields = row.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if int(remote.rsplit(":", 1)[1], 16) == port and inode == "0":
                count += state in _OPEN_STATES
    return count if seen else None


@dataclass
class S3Store(Store):
    client: Any = None
    bucket: str = ""
    prefix: str = ""
    _before: set[threading.Thread] = field(default_factory=set)

    def use(self, tag: str) -> None:
        if self.url:
            self.clear()
        self.prefix = f"{tag}/"
        self.url = f"s3://{self.bucket}/{self.prefix}"

    def names(self) -> list[str]:
        out = []
        pages = self.client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix):
            out.extend(o["Key"][len(self.prefix) :] for o in page.get("Contents", []))
        return sorted(out)

    def read(self, name: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def write(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)

    def _pending(self) -> list[dict[str, Any]]:
        found = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix)
        return list(found.get("Uploads", []))

    def uploads(self) -> list[str]:
        return sorted(u["Key"][len(self.prefix) :] for u in self._pending())

    def clear(self) -> None:
        for upload in self._pending():
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        for name in self.names():
            self.client.delete_object(Bucket=self.bucket, Key=self.prefix + name)

    def mark(self) -> None:
        self._before = set(threading.enumerate())

    def settle(self) -> None:
        # A request that reached the server before the kill still runs to its end there (a
        # CompleteMultipartUpload or a DeleteObject sent just before the kill takes effect
        # just after it), as on real S3. The server runs in this process: wait for the threads
        # that serve the worker's connections (each ends when it reads the dead socket's EOF),
        # and, where the kernel says, until no connection of the dead worker is left open:
        # one still queued for the server's accept has no thread yet.
        port = urlsplit(self.options["client_kwargs"]["endpoint_url"]).port
        assert port is not None
        deadline = time.monotonic() + 30
        while True:
            time.sleep(0.05)
            serving = [
                t for t in set(threading.enumerate()) - self._before if "process_request" in t.name
            ]
            if not serving and not unfinished_connections(port) and _faults.idle():
                return
            assert time.monotonic() < deadline, "the server still serves a killed worker"
            for thread in serving:
                if thread.ident is not None:  # else still starting: look again
                    thread.join(timeout=max(0.0, deadline - time.monotonic()))


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
    return LocalStore(env=env, root=tmp_path)


@pytest.fixture
def s3_store(
    s3_client: Any, s3_bucket: str, s3_env: dict[str, str], s3_storage_options: dict[str, Any]
) -> Store:
    return S3Store(env=s3_env, options=s3_storage_options, client=s3_client, bucket=s3_bucket)


# -- the worker ------------------------------------------------------------------------------


def _spawn(store: Store, args: list[str], linger: float) -> subprocess.Popen[str]:
    return spawn_ready(WORKER, [*args, store.url, str(linger)], "worker", store.env)


@dataclass
class Pace:
    """How long the uncut operation takes, kept current: the load of the machine changes while
    the trials run (other tests, other jobs), and kills planned from one early measurement
    would drift out of the operation. Three uncut runs first, then one more every REMEASURE
    trials; the duration is the median of the last three (one run alone varies by a factor
    of two on a busy machine), from "ready" to "done"."""

    store: Store
    objects: Objects
    args: list[str]
    runs: list[float] = field(default_factory=list)

    def measure(self, count: int = 1) -> None:
        for _ in range(count):
            self.store.fill(f"uncut-{len(self.runs)}", self.objects)
            proc = _spawn(self.store, self.args, linger=0.0)
            started = time.perf_counter()
            assert proc.stdout is not None
            done = proc.stdout.readline()
            self.runs.append(time.perf_counter() - started)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and done.startswith("done "), err

    @property
    def duration(self) -> float:
        return sorted(self.runs[-3:])[1]

    def __str__(self) -> str:
        return f"{len(self.runs)} uncut runs of {min(self.runs):.3f} to {max(self.runs):.3f} s"


REMEASURE = 10


def _fractions(rng: random.Random, trials: int) -> list[float]:
    """Stratified: one kill point drawn in each of ``trials`` equal slices of [0, REACH]
    (in units of the operation's duration), so that the kills spread over the whole
    operation and past its end."""
    fractions = [(i + rng.random()) / trials * REACH for i in range(trials)]
    rng.shuffle(fractions)
    return fractions


def _delay(pace: Pace, trial: int, fraction: float) -> float:
    if trial and trial % REMEASURE == 0:
        pace.measure()
    return fraction * pace.duration


def _kill(store: Store, args: list[str], delay: float, what: str) -> str:
    store.mark()
    proc = _spawn(store, args, linger=LINGER)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    store.settle()
    assert proc.returncode == -signal.SIGKILL, f"{what}: the worker ended by itself"
    return out


def _listed(store: Store) -> dict[str, list[str]]:
    """What list_store says, per run, newest first."""
    runs: dict[str, list[str]] = {}
    for entry in restorepoint.list_store(store.url, storage_options=store.options):
        runs.setdefault(entry.run, []).append(entry.name)
    return runs


def _verify(store: Store, name: str, what: str) -> None:
    manifest = restorepoint.verify(store.url + name, storage_options=store.options).manifest
    assert manifest.run == name.partition("/")[0], what
    assert name.endswith(f"-{manifest.id[:12]}.rp"), what


def _remaining_olds(olds: list[str], present: list[str], what: str) -> list[str]:
    """The older restore points still there: deletion goes oldest first, so they must be the
    newest few of them."""
    kept = [n for n in olds if n in present]
    assert kept == olds[len(olds) - len(kept) :], f"{what}: deleted out of order: {kept}"
    return kept


# -- kill -9 during pack into a store with keep-last 1 --------------------------------------


def run_pack_trials(
    templates: Templates, store: Store, trials: int, aim: str | None = None
) -> Counter[str]:
    """``trials`` kills spread over the pack; then, when none of them had the outcome ``aim``
    (a kill mid-upload, say: a window of the run that a loaded machine moves), up to AIMED
    more kills between the latest kill that published nothing and the earliest that published,
    halving that span each time, until one has it."""
    other_name, other_bytes = templates.other
    args = ["pack", str(templates.source)]

    # The new restore point, as an uncut run publishes it (fixed id and time: one object).
    pace = Pace(store, dict([templates.olds[0], templates.other]), args)
    pace.measure(3)
    (new_name,) = [n for n in store.names() if n.startswith(f"{R1}/")]
    new_bytes = store.read(new_name)
    _verify(store, new_name, "an uncut pack")
    partial = re.compile(
        rf"{R1}/\.{re.escape(new_name.split('/')[1])}\.rp-partial-(\d+)-[0-9a-f]{{12}}"
    )

    outcomes: Counter[str] = Counter()

    def trial(i: int, delay: float, count: int) -> bool:
        """One kill after ``delay`` s; whether the new restore point was published."""
        what = f"seed {SEED}, pack trial {i}, {count} old, kill after {delay:.3f} s"
        olds = templates.olds[:count]
        old_names = [n for n, _ in olds]
        store.fill(f"trial-{i}", dict([*olds, templates.other]))
        out = _kill(store, args, delay, what)
        what += f", the worker said {out.strip()!r}"

        # Raw: only what the publish protocol allows, the killed worker's partial file.
        names = store.names()
        complete = [n for n in names if not n.split("/")[-1].startswith(".")]
        for name in set(names) - set(complete):
            match = partial.fullmatch(name)
            assert match is not None, f"{what}: {name} is no partial file of the new one"
            assert isinstance(store, LocalStore), f"{what}: a partial object on S3: {name}"
        assert set(complete) <= {*old_names, new_name, other_name}, f"{what}: {names}"
        uploads = store.uploads()
        assert set(uploads) <= {new_name}, f"{what}: {uploads}"
        outcomes["partial files"] += len(names) - len(complete)
        outcomes["incomplete uploads"] += len(uploads)

        # Listed: exactly the complete ones; r1 never without a restore point that verifies.
        listed = _listed(store)
        assert listed.pop(R2) == [other_name], what
        r1 = listed.pop(R1, [])
        assert listed == {}, what
        assert sorted(r1) == sorted(n for n in complete if n.startswith(f"{R1}/")), what
        assert r1, f"{what}: no restore point of {R1} left"
        published = new_name in r1
        kept = _remaining_olds(old_names, r1, what)
        if not published:
            assert kept == old_names, f"{what}: an old one deleted before the new one was in"
            assert "done" not in out, what
            outcomes["not published"] += 1
        elif kept == old_names:
            outcomes["published, olds kept"] += 1
        elif kept:
            outcomes["published, olds partly deleted"] += 1
        else:
            outcomes["published, olds deleted"] += 1
        if "done" in out:
            assert kept == [], f"{what}: done, yet old ones remain"
        newest = new_name if published else old_names[-1]
        assert r1[0] == newest, what
        _verify(store, newest, what)
        if published:
            assert store.read(new_name) == new_bytes, what
        assert store.read(other_name) == other_bytes, f"{what}: {R2} touched"

        # The next prune finishes the job, leftovers included.
        report = restorepoint.prune(
            store.url, keep_last=1, run=R1, grace=0, storage_options=store.options
        )
        outcomes["leftovers cleaned"] += len(report.leftovers)
        assert [plan.verified for plan in report.runs] == [newest], what
        assert store.names() == sorted([newest, other_name]), f"{what}: {store.names()}"
        assert store.uploads() == [], what
        assert _listed(store) == {R1: [newest], R2: [other_name]}, what
        _verify(store, newest, what)
        assert store.read(other_name) == other_bytes, f"{what}: {R2} touched by prune"
        return published

    rng = random.Random(SEED)
    fractions = _fractions(rng, trials)
    counts = [rng.randint(1, 3) for _ in range(trials)]
    early, late = 0.0, REACH * pace.duration
    for i, (fraction, count) in enumerate(zip(fractions, counts, strict=True)):
        delay = _delay(pace, i, fraction)
        if trial(i, delay, count):
            late = min(late, delay)
        else:
            early = max(early, delay)
    aimed = 0
    while aim is not None and not outcomes[aim] and aimed < AIMED:
        delay = (early + late) / 2
        if trial(trials + aimed, delay, 1):
            late = delay
        else:
            early = delay
        aimed += 1
    trials += aimed

    print(
        f"\ncrash seed {SEED}: pack into {type(store).__name__} with keep-last 1: {trials} "
        f"trials, {pace}, kills in [0, {REACH}] x that: {dict(outcomes)}"
    )
    published = trials - outcomes["not published"]
    not_deleted = outcomes["published, olds kept"] + outcomes["published, olds partly deleted"]
    assert outcomes["not published"] > 0, f"seed {SEED}: no kill landed before the commit"
    assert published > 0, f"seed {SEED}: no kill landed after the commit"
    assert not_deleted > 0, f"seed {SEED}: no kill landed between the commit and the prune"
    assert outcomes["published, olds deleted"] > 0, f"seed {SEED}: no kill after the prune"
    return outcomes


def test_kill_pack_into_local_store(templates: Templates, local_store: Store) -> None:
    outcomes = run_pack_trials(templates, local_store, LOCAL_TRIALS, aim="partial files")
    assert outcomes["partial files"] > 0, "no kill left a partial file: the pack was not hit"


@pytest.mark.s3
def test_kill_pack_into_s3_store(templates: Templates, s3_store: Store) -> None:
    outcomes = run_pack_trials(templates, s3_store, S3_TRIALS, aim="incomplete uploads")
    assert outcomes["incomplete uploads"] > 0, "no kill left an upload: the pack was not hit"


# -- kill -9 during prune with keep-last 2 --------------------------------------------------


def run_prune_trials(templates: Templates, store: Store, trials: int) -> Counter[str]:
    keep = dict([templates.second, templates.newest])
    other_name, other_bytes = templates.other
    args = ["prune"]
    pace = Pace(store, {**dict(templates.olds), **keep, other_name: other_bytes}, args)
    pace.measure(3)
    assert store.names() == sorted([*keep, other_name])

    rng = random.Random(SEED + 1)
    fractions = _fractions(rng, trials)
    counts = [rng.randint(6, 10) for _ in range(trials)]
    outcomes: Counter[str] = Counter()
    for i, (fraction, count) in enumerate(zip(fractions, counts, strict=True)):
        delay = _delay(pace, i, fraction)
        what = f"seed {SEED}, prune trial {i}, {count} restore points, kill after {delay:.3f} s"
        olds = dict(templates.olds[: count - 2])
        store.fill(f"trial-{i}", {**olds, **keep, other_name: other_bytes})
        out = _kill(store, args, delay, what)
        what += f", the worker said {out.strip()!r}"

        # prune writes nothing: only what was there may remain, and no upload.
        names = store.names()
        assert set(names) <= {*olds, *keep, other_name}, f"{what}: {names}"
        assert store.uploads() == [], what
        listed = _listed(store)
        r1 = listed.pop(R1, [])
        assert listed == {R2: [other_name]}, what
        assert sorted(r1) == sorted(n for n in names if n.startswith(f"{R1}/")), what
        assert r1[:2] == sorted(keep, reverse=True), f"{what}: the 2 newest are not both there"
        for name, data in keep.items():
            assert store.read(name) == data, f"{what}: {name} changed"
            _verify(store, name, what)
        assert store.read(other_name) == other_bytes, f"{what}: {R2} touched"
        kept = _remaining_olds(list(olds), r1, what)
        if len(kept) == len(olds):
            outcomes["none deleted"] += 1
        elif kept:
            outcomes["some deleted"] += 1
        else:
            outcomes["all deleted"] += 1
        if "done" in out:
            assert kept == [], f"{what}: done, yet old ones remain"

        # A second prune finishes the job.
        report = restorepoint.prune(store.url, keep_last=2, run=R1, storage_options=store.options)
        assert sorted(report.deleted) == sorted(store.url + n for n in kept), what
        assert store.names() == sorted([*keep, other_name]), f"{what}: {store.names()}"
        assert _listed(store) == {R1: sorted(keep, reverse=True), R2: [other_name]}, what

    print(
        f"\ncrash seed {SEED}: prune keep-last 2 on {type(store).__name__}: {trials} trials, "
        f"{pace}, kills in [0, {REACH}] x that: {dict(outcomes)}"
    )
    assert outcomes["none deleted"] > 0, f"seed {SEED}: no kill landed before the deletions"
    assert outcomes["all deleted"] > 0, f"seed {SEED}: no kill landed after the deletions"
    return outcomes


def test_kill_local_prune(templates: Templates, local_store: Store) -> None:
    run_prune_trials(templates, local_store, LOCAL_TRIALS)


@pytest.mark.s3
def test_kill_s3_prune(templates: Templates, s3_store: Store) -> None:
    run_prune_trials(templates, s3_store, S3_TRIALS)
