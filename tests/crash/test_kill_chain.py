"""kill -9 during an incremental publish and during prune, with chains in the store (spec
section 28.5): a prune never deletes a base of a restore point it keeps, so every kept restore
point verifies and resumes bit for bit whatever the moment of the kill.

A real worker process (``_store_worker.py``) is killed with SIGKILL after a random delay, on a
local store and on S3 (moto's server, through s3fs), as in test_kill_store.py (whose stores, pace
and kill it shares). The store holds run r1 as a chain, one of:

- **chain**: a full restore point F1 (``delta/1``, no base) and 1 to 4 incremental ones, each
  referencing F1's frames of a frozen backbone (references are flattened: one hop);
- **rebased**: F1, I2 and I3 referencing it, then a full F4 and I5 referencing F4: pruning to
  the newest deletes F1 while I2 and I3, which reference it, are still listed;

beside one restore point of run r2. Two scenarios:

- **incremental publish, keep-last 1**: the worker publishes r1's newest incrementally (the
  frozen backbone referenced in the newest one's base, a new trained part uploaded), then prunes
  r1 to it and its base. After each kill: every restore point the prune keeps (the new one and
  its base once the new one is listed, else all of them) is listed, byte-identical where it was
  there before, verifies and imports bit for bit; the others are deleted oldest first, and one
  still listed fails verification, if at all, only because its own base is gone; r2's is
  byte-identical. The next prune leaves exactly the newest and its base, which verify.
- **prune, keep-last 2**: the 2 newest and their bases are kept (in the rebased chain the newest
  one's base is one of the 2), the others deleted oldest first; the same checks.

Across the trials the outcomes on both sides of each commit point must occur, or the kills did
not cover the operation. RESTOREPOINT_CRASH_SEED replays a run; RESTOREPOINT_CRASH_TRIALS sets
the number of kills per scenario and store.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import IntegrityError
from restorepoint.ops.publish import HeadSpec, PackOptions, publish
from restorepoint.testing.store import payload

from ._ready import trials
from ._store_worker import CHUNK_SIZE
from .test_kill_store import (
    REACH,
    LocalStore,
    Objects,
    Pace,
    S3Store,
    Store,
    _delay,
    _fractions,
    _kill,
    _listed,
    _verify,
)

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RESTOREPOINT_CRASH_SEED", "20261227"))
#: Fewer than the other scenarios': each trial also imports every kept restore point.
LOCAL_TRIALS = trials(12)
S3_TRIALS = trials(10)
R1, R2 = "r1", "r2"
FROZEN = (4 << 20) + 3  # the backbone every restore point of r1 holds unchanged
TRAINED = (1 << 20) - 7  # what each step changes
#: What the worker's restore point changes: most of its publish before the commit is this
#: upload (after it come the verification through the references and the prune).
NEW_TRAINED = (4 << 20) - 5
NEW_STEP = 10  # _store_worker.STEP: the worker's restore point
#: Kill points of the publish scenario up to this multiple of the measured publish (REACH for
#: the prune): on S3 most of it comes after the commit (the verification through the
#: references, a ranged read per frame, and the prune's), so that kills past its end would
#: leave few before the commit.
PUBLISH_REACH = 1.0


@dataclass(frozen=True)
class Point:
    name: str  # its store name
    data: bytes
    source: Path  # the files it holds


@dataclass(frozen=True)
class Chains:
    source: Path  # what the worker publishes
    chain: list[Point]  # F1, then I2 to I5 referencing F1
    rebased: list[Point]  # F1, I2 and I3 referencing F1, F4, I5 referencing F4
    other: Point  # r2's only restore point


def _source(root: Path, step: int, frozen: bytes) -> Path:
    src = root / f"src-{step}"
    src.mkdir()
    (src / "backbone.bin").write_bytes(frozen)
    trained = NEW_TRAINED if step == NEW_STEP else TRAINED
    (src / "trained.bin").write_bytes(payload(trained, seed=SEED + step))
    (src / "position.json").write_text(json.dumps({"step": step}))
    return src


def _publish(src: Path, store: Path, step: int, bases: list[str], run: str = R1) -> Point:
    options = PackOptions(chunk_size=CHUNK_SIZE, incremental=True)
    result = publish(str(src), f"{store}/", HeadSpec(step, run=run), options)
    named = [b.name for b in result.manifest.bases or ()]
    assert named == bases, f"step {step} names {named}, not {bases}"
    name = Path(result.url).relative_to(store).as_posix()
    return Point(name, Path(result.url).read_bytes(), src)


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> Chains:
    root = tmp_path_factory.mktemp("chains")
    frozen = payload(FROZEN, seed=SEED)
    sources = {step: _source(root, step, frozen) for step in (1, 2, 3, 4, 5, NEW_STEP)}
    # chain: each publish into the store that holds the ones before it.
    store = root / "chain"
    first = _publish(sources[1], store, 1, [])
    chain = [first] + [_publish(sources[s], store, s, [first.name]) for s in (2, 3, 4, 5)]
    # rebased: F4 published where r1 has nothing yet (a full one), then copied in.
    rebased_store = root / "rebased"
    for point in chain[:3]:
        path = rebased_store / point.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(point.data)
    full = _publish(sources[4], root / "alone", 4, [])
    (rebased_store / full.name).write_bytes(full.data)
    rebased = [*chain[:3], full, _publish(sources[5], rebased_store, 5, [full.name])]
    other_src = root / "other"
    other_src.mkdir()
    (other_src / "model.bin").write_bytes(payload(40_000, seed=SEED + 99))
    other = _publish(other_src, root / "other-store", 3, [], run=R2)
    return Chains(sources[NEW_STEP], chain, rebased, other)


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
    (tmp_path / "stores").mkdir()
    return LocalStore(env=env, root=tmp_path / "stores")


@pytest.fixture
def s3_store(
    s3_client: Any, s3_bucket: str, s3_env: dict[str, str], s3_storage_options: dict[str, Any]
) -> Store:
    return S3Store(env=s3_env, options=s3_storage_options, client=s3_client, bucket=s3_bucket)


# -- what every trial checks ---------------------------------------------------------------


def _resumes(store: Store, name: str, source: Path, scratch: Path, what: str) -> None:
    """Verified, and imported bit for bit: what a resume from it gets."""
    _verify(store, name, what)
    dest = scratch / "import"
    restorepoint.import_restore_point(store.url + name, dest, storage_options=store.options)
    try:
        got = sorted(p.name for p in dest.iterdir())
        assert got == sorted(p.name for p in source.iterdir()), f"{what}: {name}: {got}"
        for path in source.iterdir():
            assert (dest / path.name).read_bytes() == path.read_bytes(), f"{what}: {name}"
    finally:
        shutil.rmtree(dest)


def _verify_failure(store: Store, name: str, what: str) -> str | None:
    try:
        _verify(store, name, what)
    except IntegrityError as exc:
        return str(exc)
    return None


def _check_chain(
    store: Store,
    r1: list[str],
    keep: dict[str, Path],
    doomed: list[str],
    before: dict[str, bytes],
    scratch: Path,
    what: str,
) -> Counter[str]:
    """Every kept one listed and resumable, the doomed ones deleted oldest first, and a doomed
    one still listed failing, if at all, only for its own missing base."""
    outcomes: Counter[str] = Counter()
    missing = [n for n in keep if n not in r1]
    assert missing == [], f"{what}: kept restore points deleted: {missing}"
    left = [n for n in doomed if n in r1]
    assert left == doomed[len(doomed) - len(left) :], f"{what}: deleted out of order: {left}"
    assert sorted(r1) == sorted([*keep, *left]), f"{what}: {r1}"
    for name, source in keep.items():
        if name in before:
            assert store.read(name) == before[name], f"{what}: {name} changed"
        _resumes(store, name, source, scratch, what)
    for name in left:
        failure = _verify_failure(store, name, what)
        if failure is not None:
            # Its base went first (oldest first): allowed only for one the prune deletes.
            assert re.search(r"base r1/\S+ is missing", failure), f"{what}: {name}: {failure}"
            outcomes["doomed ones listed without their base"] += 1
    return outcomes


# -- kill -9 during an incremental publish with keep-last 1 -----------------------------------


def run_publish_trials(chains: Chains, store: Store, scratch: Path, trials: int) -> Counter[str]:
    other = chains.other
    args = ["incremental", str(chains.source)]
    pace = Pace(store, {p.name: p.data for p in [*chains.chain[:3], other]}, args)
    pace.measure(3)
    first = chains.chain[0].name
    (new_name,) = [n for n in store.names() if n.startswith(f"{R1}/") and n != first]
    assert f"{NEW_STEP:016d}" in new_name
    new_manifest = restorepoint.read_manifest(store.url + new_name, storage_options=store.options)
    assert [b.name for b in new_manifest.bases or ()] == [first]
    partial = re.compile(
        rf"{R1}/\.{re.escape(new_name.split('/')[1])}\.rp-partial-(\d+)-[0-9a-f]{{12}}"
    )

    rng = random.Random(SEED)
    fractions = [f * PUBLISH_REACH / REACH for f in _fractions(rng, trials)]
    shapes = [rng.choice(["chain", "rebased"]) for _ in range(trials)]
    lengths = [rng.randint(2, 5) for _ in range(trials)]
    outcomes: Counter[str] = Counter()
    for i, (fraction, shape, length) in enumerate(zip(fractions, shapes, lengths, strict=True)):
        delay = _delay(pace, i, fraction)
        points = chains.chain[:length] if shape == "chain" else chains.rebased
        base = points[0] if shape == "chain" else points[3]
        what = (
            f"seed {SEED}, incremental publish trial {i}, {shape} of {len(points)}, "
            f"kill after {delay:.3f} s"
        )
        before: Objects = {p.name: p.data for p in [*points, other]}
        store.fill(f"trial-{i}", before)
        out = _kill(store, args, delay, what)
        what += f", the worker said {out.strip()!r}"

        names = store.names()
        complete = [n for n in names if not n.split("/")[-1].startswith(".")]
        for name in set(names) - set(complete):
            assert partial.fullmatch(name), f"{what}: {name} is no partial file of the new one"
            assert isinstance(store, LocalStore), f"{what}: a partial object on S3: {name}"
        assert set(complete) <= {*before, new_name}, f"{what}: {names}"
        assert set(store.uploads()) <= {new_name}, f"{what}: {store.uploads()}"
        outcomes["partial files"] += len(names) - len(complete)
        outcomes["incomplete uploads"] += len(store.uploads())

        listed = _listed(store)
        assert listed.pop(R2) == [other.name], what
        r1 = listed.pop(R1, [])
        assert listed == {}, what
        published = new_name in r1
        if published:
            keep = {new_name: chains.source, base.name: base.source}
            doomed = [p.name for p in points if p.name != base.name]
        else:
            assert "done" not in out, what
            keep, doomed = {p.name: p.source for p in points}, []
        assert r1[0] == (new_name if published else points[-1].name), what
        outcomes += _check_chain(store, r1, keep, doomed, before, scratch, what)
        left = [n for n in doomed if n in r1]
        if "done" in out:
            assert left == [], f"{what}: done, yet old ones remain"
        if not published:
            outcomes["not published"] += 1
        elif len(left) == len(doomed):
            outcomes["published, olds kept"] += 1
        elif left:
            outcomes["published, olds partly deleted"] += 1
        else:
            outcomes["published, olds deleted"] += 1
        assert store.read(other.name) == other.data, f"{what}: {R2} touched"

        # The next prune finishes the job, leftovers included: the newest and its base.
        report = restorepoint.prune(
            store.url, keep_last=1, run=R1, grace=0, storage_options=store.options
        )
        outcomes["leftovers cleaned"] += len(report.leftovers)
        newest = r1[0]
        final = {newest, base.name}
        assert store.names() == sorted([*final, other.name]), f"{what}: {store.names()}"
        assert store.uploads() == [], what
        for name in final:
            _verify(store, name, f"{what}, after the next prune")

    print(
        f"\ncrash seed {SEED}: incremental publish with keep-last 1 into "
        f"{type(store).__name__} holding a chain: {trials} trials, {pace}, kills in "
        f"[0, {PUBLISH_REACH}] x that: {dict(outcomes)}"
    )
    assert outcomes["not published"] > 0, f"seed {SEED}: no kill landed before the commit"
    assert trials - outcomes["not published"] > 0, f"seed {SEED}: no kill after the commit"
    return outcomes


def test_kill_incremental_publish_into_local_chain(
    chains: Chains, local_store: Store, tmp_path: Path
) -> None:
    outcomes = run_publish_trials(chains, local_store, tmp_path, LOCAL_TRIALS)
    assert outcomes["partial files"] > 0, "no kill left a partial file: the pack was not hit"


@pytest.mark.s3
def test_kill_incremental_publish_into_s3_chain(
    chains: Chains, s3_store: Store, tmp_path: Path
) -> None:
    run_publish_trials(chains, s3_store, tmp_path, S3_TRIALS)


# -- kill -9 during prune with keep-last 2 ----------------------------------------------------


def run_prune_trials(chains: Chains, store: Store, scratch: Path, trials: int) -> Counter[str]:
    other = chains.other
    args = ["prune"]
    pace = Pace(store, {p.name: p.data for p in [*chains.chain, other]}, args)
    pace.measure(3)
    f1, i4, i5 = chains.chain[0], chains.chain[3], chains.chain[4]
    assert store.names() == sorted([f1.name, i4.name, i5.name, other.name])

    rng = random.Random(SEED + 1)
    fractions = _fractions(rng, trials)
    shapes = [rng.choice(["chain", "rebased"]) for _ in range(trials)]
    outcomes: Counter[str] = Counter()

    def trial(i: int, fraction: float, shape: str) -> None:
        delay = _delay(pace, i, fraction)
        what = f"seed {SEED}, prune trial {i}, {shape}, kill after {delay:.3f} s"
        points = chains.chain if shape == "chain" else chains.rebased
        # chain: I5, I4 and their base F1; rebased: I5 and its base F4, the second newest.
        kept = [points[4], points[3]] + ([points[0]] if shape == "chain" else [])
        keep = {p.name: p.source for p in kept}
        doomed = [p.name for p in points if p.name not in keep]
        before: Objects = {p.name: p.data for p in [*points, other]}
        store.fill(f"trial-{i}", before)
        out = _kill(store, args, delay, what)
        what += f", the worker said {out.strip()!r}"

        names = store.names()
        assert set(names) <= set(before), f"{what}: {names}"
        assert store.uploads() == [], what
        listed = _listed(store)
        r1 = listed.pop(R1, [])
        assert listed == {R2: [other.name]}, what
        assert r1[0] == points[4].name, what
        outcomes.update(_check_chain(store, r1, keep, doomed, before, scratch, what))
        left = [n for n in doomed if n in r1]
        if "done" in out:
            assert left == [], f"{what}: done, yet old ones remain"
        if len(left) == len(doomed):
            outcomes["none deleted"] += 1
        elif left:
            outcomes["some deleted"] += 1
        else:
            outcomes["all deleted"] += 1
        assert store.read(other.name) == other.data, f"{what}: {R2} touched"

        report = restorepoint.prune(store.url, keep_last=2, run=R1, storage_options=store.options)
        assert sorted(report.deleted) == sorted(store.url + n for n in left), what
        assert store.names() == sorted([*keep, other.name]), f"{what}: {store.names()}"

    for i, (fraction, shape) in enumerate(zip(fractions, shapes, strict=True)):
        trial(i, fraction, shape)
    # The kill points are fractions of a prune's measured time; a machine whose load rose
    # since the measure can stretch every prune past them. Then later kills, until one lands
    # after the deletions (a few at most), so that the trials cover that side too.
    for extra in range(4):
        if outcomes["all deleted"]:
            break
        trial(trials + extra, REACH * (2 + 2 * extra), "chain")

    print(
        f"\ncrash seed {SEED}: prune keep-last 2 of a chain on {type(store).__name__}: "
        f"{trials} trials, {pace}, kills in [0, {REACH}] x that: {dict(outcomes)}"
    )
    assert outcomes["none deleted"] > 0, f"seed {SEED}: no kill landed before the deletions"
    assert outcomes["all deleted"] > 0, f"seed {SEED}: no kill landed after the deletions"
    return outcomes


def test_kill_local_prune_of_chains(chains: Chains, local_store: Store, tmp_path: Path) -> None:
    run_prune_trials(chains, local_store, tmp_path, LOCAL_TRIALS)


@pytest.mark.s3
def test_kill_s3_prune_of_chains(chains: Chains, s3_store: Store, tmp_path: Path) -> None:
    run_prune_trials(chains, s3_store, tmp_path, S3_TRIALS)
