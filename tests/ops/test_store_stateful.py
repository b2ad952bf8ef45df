"""A store under publishes, prunes, corruption and kills, checked against a model of what it
should hold (in the style of zarr-python's ``testing/stateful.py``).

The model knows each run's restore points (step, creation time, whether a byte was flipped),
the garbage that interrupted publishes left (never listed, never deleted: not partial names),
and the partial files (deleted by a prune only when old and their writer is gone). After every
step the store must hold exactly what the model says, and list exactly the model's restore
points, newest first."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import restorepoint
from restorepoint import NotFound
from restorepoint.format import read_head
from restorepoint.ops import entry_name
from restorepoint.ops.store import latest, list_store, prune
from restorepoint.storage import resolve

CHUNK = 65536
RUNS = ("a", "b")
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: No process has this PID (Linux PIDs stay below 2**22).
DEAD_PID = 99_999_999
#: An mtime far older than any grace period.
LONG_AGO = 1_000_000.0


@dataclass
class Item:
    """One restore point as the model sees it."""

    name: str  # RUN/NAME
    step: int
    at: int  # seconds after EPOCH: publishes never share one
    corrupt: bool = False

    @property
    def order(self) -> tuple[int, int]:
        return (self.step, self.at)


@dataclass(frozen=True)
class Partial:
    """A leftover under a partial name."""

    run: str
    dead: bool  # its writer's PID is gone
    old: bool  # older than the grace period


def retained(items: list[Item], keep_last: int) -> list[Item]:
    """What keep-last N must leave of one run (newest first): the N newest, the newest, the
    newest that verifies and everything newer (all of them when none verifies)."""
    keep = {id(i) for i in items[:keep_last]}
    for item in items:
        keep.add(id(item))
        if not item.corrupt:
            break
    return [i for i in items if id(i) in keep]


def flip_payload_byte(path: Path) -> None:
    reader = resolve(str(path)).reader()
    try:
        offset = read_head(reader).data_start + 4  # past the first frame's length
    finally:
        reader.close()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="rp-stateful-"))
        self.source = self.root / "ckpt"
        self.source.mkdir()
        (self.source / "weights.bin").write_bytes(os.urandom(700))
        self.store = self.root / "store"
        self.clock = 0
        self.items: dict[str, list[Item]] = {run: [] for run in RUNS}
        self.ever: set[str] = set()
        self.junk: set[str] = set()  # relative paths
        self.partials: dict[str, Partial] = {}  # relative path -> what it is
        self.serial = 0

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- the model ---------------------------------------------------------------------------

    def newest_first(self, run: str) -> list[Item]:
        return sorted(self.items[run], key=lambda i: i.order, reverse=True)

    def path(self, rel: str) -> Path:
        return self.store / rel

    def url(self, rel: str) -> str:
        return f"{self.store}/{rel}"

    def forget(self, names: set[str]) -> None:
        for run in RUNS:
            self.items[run] = [i for i in self.items[run] if i.name not in names]

    def expected_plan(self, run: str | None, keep_last: int) -> list[str]:
        """The URLs a prune deletes, in its order: runs by name, each oldest first."""
        out = []
        for name in sorted(RUNS):
            if run is not None and name != run:
                continue
            items = self.newest_first(name)
            kept = {i.name for i in retained(items, keep_last)}
            out += [self.url(i.name) for i in reversed(items) if i.name not in kept]
        return out

    # -- rules -------------------------------------------------------------------------------

    @rule(run=st.sampled_from(RUNS), step=st.integers(0, 5))
    def publish(self, run: str, step: int) -> None:
        self.clock += 1
        t = EPOCH + timedelta(seconds=self.clock)
        result = restorepoint.pack(
            self.source, f"{self.store}/", position=step, run=run, chunk_size=CHUNK, level=0,
            threads=1, created=t.strftime("%Y-%m-%dT%H:%M:%S.000Z"), incremental=False,
        )  # fmt: skip
        name = entry_name(result.manifest)
        assert result.url == self.url(name)
        self.items[run].append(Item(name, step, self.clock))
        self.ever.add(run)

    @rule(run=st.sampled_from((None, *RUNS)), keep_last=st.integers(1, 3))
    def prune_store(self, run: str | None, keep_last: int) -> None:
        expected = self.expected_plan(run, keep_last)
        report = prune(str(self.store), keep_last=keep_last, run=run)
        assert report.deleted == expected
        self.forget({u[len(str(self.store)) + 1 :] for u in expected})
        for name in RUNS:
            if run is None or name == run:
                kept = [e.name for e in list_store(str(self.store), run=name)]
                assert kept == [i.name for i in retained(self.newest_first(name), keep_last)]
        gone = {
            rel
            for rel, p in self.partials.items()
            if p.dead and p.old and (run is None or p.run == run)
        }
        assert sorted(report.leftovers) == sorted(self.url(rel) for rel in gone)
        for rel in gone:
            del self.partials[rel]

    @rule(run=st.sampled_from(RUNS), newest=st.booleans(), which=st.integers(0, 50))
    def corrupt(self, run: str, newest: bool, which: int) -> None:
        items = self.newest_first(run)
        if not items:
            return
        item = items[0] if newest else items[which % len(items)]
        if item.corrupt:
            return  # a second flip would mend it
        flip_payload_byte(self.path(item.name))
        item.corrupt = True

    @rule(
        run=st.sampled_from(RUNS),
        kind=st.sampled_from(("dead-old", "dead-young", "alive-old", "truncated", "both")),
    )
    def kill_publish(self, run: str, kind: str) -> None:
        """What a writer killed mid-publish leaves: a partial file, and, from tools that copy
        without a temporary name, a truncated object under a name that is no store name."""
        self.serial += 1
        final = f"{self.serial:016d}-20260101T000000000Z-{self.serial:012x}.rp"
        data = os.urandom(300)
        if self.items[run]:
            whole = self.path(self.items[run][-1].name).read_bytes()
            data = whole[: len(whole) // 2]
        directory = self.store / run
        directory.mkdir(parents=True, exist_ok=True)
        if kind in ("truncated", "both"):
            rel = f"{run}/{final}.part"
            self.path(rel).write_bytes(data)
            # Old, so that a prune that took anything old for a leftover would take it.
            os.utime(self.path(rel), (LONG_AGO, LONG_AGO))
            self.junk.add(rel)
        if kind != "truncated":
            dead = kind != "alive-old"
            pid = DEAD_PID if dead else os.getpid()
            rel = f"{run}/.{final}.rp-partial-{pid}-{self.serial:012x}"
            path = self.path(rel)
            path.write_bytes(data)
            old = kind != "dead-young"
            # young: in the future, so no "now" is ever a grace period past it
            mtime = LONG_AGO if old else datetime.now(timezone.utc).timestamp() + 86400
            os.utime(path, (mtime, mtime))
            self.partials[rel] = Partial(run, dead, old)

    @rule(
        run=st.sampled_from((None, *RUNS)),
        keep_last=st.integers(1, 3),
        done=st.integers(0, 10),
    )
    def kill_prune(self, run: str | None, keep_last: int, done: int) -> None:
        """A prune killed after ``done`` deletions: its plan, carried out only in part."""
        plan = prune(str(self.store), keep_last=keep_last, run=run, dry_run=True)
        deletions = [e for p in plan.runs for e in p.delete]
        assert [e.url for e in deletions] == self.expected_plan(run, keep_last)
        for entry in deletions[:done]:
            Path(entry.url).unlink()
        self.forget({e.name for e in deletions[:done]})

    @rule(run=st.sampled_from(RUNS))
    def verify_latest(self, run: str) -> None:
        items = self.newest_first(run)
        sound = [i for i in items if not i.corrupt]
        if sound:
            assert latest(str(self.store), run=run, verify_it=True).name == sound[0].name
        else:
            try:
                latest(str(self.store), run=run, verify_it=True)
            except NotFound:
                pass
            else:
                raise AssertionError(f"run {run}: nothing should verify")
        if items:
            assert latest(str(self.store), run=run).name == items[0].name

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def lists_exactly_the_model(self) -> None:
        listed = list_store(str(self.store))
        for run in RUNS:
            assert [e.name for e in listed if e.run == run] == [
                i.name for i in self.newest_first(run)
            ]
        assert len(listed) == sum(len(v) for v in self.items.values())

    @invariant()
    def every_run_keeps_its_newest(self) -> None:
        for run in self.ever:
            items = self.newest_first(run)
            assert items, f"run {run} lost every restore point"
            assert self.path(items[0].name).is_file()

    @invariant()
    def holds_exactly_what_the_model_says(self) -> None:
        on_disk = (
            {p.relative_to(self.store).as_posix() for p in self.store.rglob("*") if p.is_file()}
            if self.store.exists()
            else set()
        )
        model = {i.name for v in self.items.values() for i in v}
        assert on_disk == model | self.junk | set(self.partials)


StoreMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStore = StoreMachine.TestCase
