"""The storage conformance suites, run against every backend: ``LocationConformance`` (a
backend's own guarantees: publish, read, list) and ``StoreConformance`` built on it (a store
of restore points on that backend: list, latest, prune, concurrent publishers, the CLI).

In the style of zarr-python's ``testing/store.py`` and fsspec's ``tests/abstract``: a backend's
test module holds a small subclass (named ``Test...`` so that pytest collects it) that provides

- a fixture ``base_url``: a fresh, empty URL prefix ending in ``/``;
- a fixture ``storage_options``: the fsspec options for that URL (``{}`` by default);
- ``raw_get(url)``, ``raw_put(url, data)`` and ``raw_list(prefix)``: helpers that reach the
  store without restorepoint, so that the suite checks what really is there, not what
  restorepoint believes. ``raw_list`` names every object under the prefix (relative to it,
  hidden and partial names included), sorted.

Every test asserts something. A test of an ability the backend does not declare in its
``Abilities`` is skipped with the reason, never passed silently::

    class TestMyStore(StoreConformance):   # or LocationConformance: the backend alone
        @pytest.fixture
        def base_url(self, tmp_path): ...

        def raw_get(self, url): ...
        def raw_put(self, url, data): ...
        def raw_list(self, prefix): ...

The store tests (``test_store_...``) pack into ``BASE/store/`` and go through ``list_store``,
``latest`` and ``prune``; those that run the CLI in a subprocess use the fixture
``store_env``: the environment in which another process reaches the store. By default it is
this process's environment with the storage options as fsspec's ``FSSPEC_<PROTOCOL>`` JSON
variable, and None (the test is skipped, or uses threads) for ``memory://``, which lives in
one process. A backend whose options are not JSON, or that needs more, overrides it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..ops import PackResult, latest, list_store, pack, prune, verify
from ..ops.store import DEFAULT_GRACE_S, entry_name
from ..storage import FsspecLocation, Location, partial_name, resolve
from .location import LocationConformance, backend_of, payload, publish_and_fail, read_all

__all__ = [
    "STORE_NAME",
    "LocationConformance",
    "StoreConformance",
    "checkpoint",
    "dead_pid",
    "payload",
    "publish_and_fail",
    "read_all",
    "run_cli",
]


#: A restore point's name in a store (spec section "Stores"), written out here rather than
#: taken from the implementation: RUN/STEP16-YYYYMMDDTHHMMSSmmmZ-ID12.rp
STORE_NAME = re.compile(
    r"(?P<run>[A-Za-z0-9][A-Za-z0-9._-]{0,63})/(?P<step>[0-9]{16})-"
    r"(?P<created>[0-9]{8}T[0-9]{9}Z)-(?P<id>[0-9a-f]{12})\.rp"
)


def checkpoint(directory: Path, seed: int, size: int = 40_000) -> Path:
    """A small checkpoint directory whose bytes depend on ``seed``."""
    directory.mkdir(parents=True)
    (directory / "model.bin").write_bytes(payload(size, seed))
    (directory / "meta.json").write_text(json.dumps({"seed": seed}))
    return directory


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``restorepoint ARGS`` in a subprocess, as a user runs it, in environment ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "restorepoint", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def dead_pid() -> int:
    """The PID of a process that has exited: a writer that is gone. (Linux hands PIDs out in
    increasing order up to pid_max before any is reused, so it stays free for a test.)"""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


class StoreConformance(LocationConformance):
    """The location suite, and the store on top of it: restore points packed into
    ``BASE/store/``, listed, chosen, pruned, by two publishers at once and through the CLI in
    another process. Subclass it for a backend that holds stores (every built-in one does)."""

    @pytest.fixture
    def store_env(self, base_url: str, storage_options: dict[str, Any]) -> dict[str, str] | None:
        """The environment in which a subprocess reaches the store, or None where no other
        process can (see the module docstring)."""
        protocol = backend_of(self.location(base_url, storage_options))
        if protocol == "memory":
            return None
        env = {k: v for k, v in os.environ.items() if not k.startswith("FSSPEC_")}
        if storage_options:
            try:
                env[f"FSSPEC_{protocol.upper()}"] = json.dumps(storage_options)
            except TypeError:
                return None
        return env

    def store_names(self, store_url: str, run: str | None = None) -> list[str]:
        """The restore-point names really in the store (of ``run``), sorted."""
        found = []
        for name in self.raw_list(store_url):
            match = STORE_NAME.fullmatch(name)
            if match is not None and (run is None or match["run"] == run):
                found.append(name)
        return found

    def partial_name(self, final: str, pid: int) -> str:
        return partial_name(final, pid=pid, suffix="abcdef123456")

    @contextlib.contextmanager
    def watching(self, store_url: str, run: str) -> Iterator[list[list[str]]]:
        """Look at the store (raw) over and over while the block runs; yields the
        observations, each the names of ``run``'s restore points seen at that moment."""
        seen: list[list[str]] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def poll() -> None:
            while True:
                try:
                    seen.append(self.store_names(store_url, run))
                except Exception as exc:
                    failures.append(exc)
                    return
                # A light poll: the machine is shared, and a listing every 50 ms still
                # sees the store many times during one pack.
                if stop.wait(0.05):
                    return

        poller = threading.Thread(target=poll, name="store-watcher", daemon=True)
        poller.start()
        try:
            yield seen
        finally:
            stop.set()
            poller.join(timeout=60)
        if failures:
            raise failures[0]
        seen.append(self.store_names(store_url, run))

    def test_store_publish_list_latest(
        self, base_url: str, storage_options: dict[str, Any], tmp_path: Path
    ) -> None:
        store = base_url + "store/"
        options = dict(storage_options)
        result = pack(
            checkpoint(tmp_path / "src", 1), store, position=7, run="run-a", storage_options=options
        )
        assert result.url.startswith(store)
        name = result.url[len(store) :]
        match = STORE_NAME.fullmatch(name)
        assert match is not None, name
        assert (match["run"], int(match["step"]), match["id"]) == ("run-a", 7, result.id[:12])
        assert name == entry_name(result.manifest)
        assert self.raw_list(store) == [name]
        entries = list_store(store, storage_options=options)
        assert [(e.url, e.run, e.step, e.size) for e in entries] == [
            (result.url, "run-a", 7, result.size)
        ]
        assert list_store(store, run="run-a", storage_options=options) == entries
        assert list_store(store, run="run-b", storage_options=options) == []
        assert latest(store, storage_options=options) == entries[0]
        assert latest(store, run="run-a", verify_it=True, storage_options=options) == entries[0]
        assert verify(result.url, storage_options=options).manifest.id == result.id

    def test_store_never_lists_leftovers(
        self, base_url: str, storage_options: dict[str, Any], tmp_path: Path
    ) -> None:
        store = base_url + "store/"
        options = dict(storage_options)
        result = pack(
            checkpoint(tmp_path / "src", 2), store, position=3, run="run-a", storage_options=options
        )
        name = result.url[len(store) :]
        # What an interrupted publisher leaves (PID 1: a writer that is alive) and what
        # restorepoint never wrote: names that are not restore points of a run.
        partial = "run-a/" + self.partial_name("x.rp", 1)
        strangers = [
            "run-a/notes.txt",
            "run-a/0000000000000009-20260101T000000000Z-abcdef12345.rp",  # 11 hex digits
            "run-a/" + name.split("/")[1] + ".bak",
            "0000000000000009-20260101T000000000Z-abcdef123456.rp",  # not under a run
            "run-a/deeper/0000000000000009-20260101T000000000Z-abcdef123456.rp",
        ]
        self.raw_put(store + partial, b"half of a restore point")
        for stranger in strangers:
            self.raw_put(store + stranger, self.raw_get(result.url))
        assert sorted([name, partial, *strangers]) == self.raw_list(store)
        entries = list_store(store, storage_options=options)
        assert [e.url for e in entries] == [result.url]
        assert [e.url for e in list_store(store, run="run-a", storage_options=options)] == [
            result.url
        ]
        assert latest(store, storage_options=options).url == result.url
        # prune never takes a stranger for its own, and leaves a young partial alone.
        report = prune(store, keep_last=1, storage_options=options)
        assert (report.deleted, report.leftovers) == ([], [])
        assert self.raw_list(store) == sorted([name, partial, *strangers])
        location = self.location(store, options)
        report = prune(
            store, keep_last=1, storage_options=options, now=time.time() + 2 * DEFAULT_GRACE_S
        )
        assert report.deleted == []
        if location.abilities.atomic_rename:
            # A local partial whose writer lives (PID 1 always does) is never a leftover.
            assert report.leftovers == []
            assert self.raw_list(store) == sorted([name, partial, *strangers])
        else:
            assert report.leftovers == [store + partial]
            assert self.raw_list(store) == sorted([name, *strangers])

    def test_store_listing_cache_never_hides_a_restore_point(
        self, base_url: str, storage_options: dict[str, Any], tmp_path: Path
    ) -> None:
        import fsspec.core

        store = base_url + "store/"
        options = dict(storage_options)
        first = self.location(store, options)
        a = pack(checkpoint(tmp_path / "a", 3), first, into_store=True, position=1, run="run-a")
        assert [e.url for e in list_store(first)] == [a.url]
        if isinstance(first, FsspecLocation):
            # Warm every listing cache the first instance has: the store, the run, the object.
            run_path = first.path.rstrip("/") + "/run-a"
            assert any(e["name"].endswith(".rp") for e in first.fs.ls(run_path, detail=True))
            first.fs.ls(first.path.rstrip("/"), detail=True)
            first.fs.info(run_path + "/" + a.url.rsplit("/", 1)[1])
            # Another process: here another filesystem instance, with caches of its own.
            fs2, path2 = fsspec.core.url_to_fs(store, skip_instance_cache=True, **options)
            assert fs2 is not first.fs
            second: Location = type(first)(store, fs2, path2)
        else:
            second = resolve(store, options)
        b = pack(checkpoint(tmp_path / "b", 4), second, into_store=True, position=2, run="run-a")
        # And one put in place behind restorepoint's back: a complete restore point copied
        # under its store name, as a sync tool would.
        c = pack(
            checkpoint(tmp_path / "c", 5),
            base_url + "elsewhere.rp",
            position=3,
            run="run-a",
            storage_options=options,
        )
        c_url = store + entry_name(c.manifest)
        self.raw_put(c_url, self.raw_get(c.url))
        # Listed again through the first instance, caches and all: everything is there.
        entries = list_store(first)
        assert [e.url for e in entries] == [c_url, b.url, a.url]
        assert [e.step for e in entries] == [3, 2, 1]
        newest = latest(first)
        assert (newest.url, newest.step) == (c_url, 3)
        assert latest(first, verify_it=True).url == c_url
        assert verify(c_url, storage_options=options).manifest.id == c.id

    def test_store_two_publishers_at_once(
        self,
        base_url: str,
        storage_options: dict[str, Any],
        store_env: dict[str, str] | None,
        tmp_path: Path,
    ) -> None:
        store = base_url + "store/"
        options = dict(storage_options)
        sources = [checkpoint(tmp_path / f"src-{i}", 10 + i, size=1 << 20) for i in (0, 1)]
        results: list[dict[str, Any]] = []
        if store_env is not None:
            # Two processes, as two jobs of one run would be: each packs its own source into
            # the same run at the same step.
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "restorepoint",
                        "pack",
                        str(src),
                        store,
                        "--run",
                        "duo",
                        "--step",
                        "5",
                        "--json",
                    ],
                    env=store_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for src in sources
            ]
            for proc in procs:
                out, err = proc.communicate(timeout=180)
                assert proc.returncode == 0, err
                results.append(json.loads(out))
        else:
            # memory:// lives in this process: two threads are the two publishers.
            done: list[PackResult] = []
            failed: list[BaseException] = []

            def publish(src: Path) -> None:
                try:
                    done.append(pack(src, store, position=5, run="duo", storage_options=options))
                except BaseException as exc:
                    failed.append(exc)

            threads = [threading.Thread(target=publish, args=(src,)) for src in sources]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=180)
            assert failed == []
            results = [r.to_dict() for r in done]
        assert len(results) == 2
        urls = [r["url"] for r in results]
        assert len(set(urls)) == 2, urls
        assert len({r["id"] for r in results}) == 2
        entries = list_store(store, storage_options=options)
        assert sorted(e.url for e in entries) == sorted(urls)
        assert {(e.run, e.step) for e in entries} == {("duo", 5)}
        assert self.raw_list(store) == sorted(u[len(store) :] for u in urls)
        digests = set()
        for r in results:
            report = verify(r["url"], storage_options=options)
            assert (report.manifest.id, report.size) == (r["id"], r["size"])
            assert report.manifest.run == "duo"
            assert report.digest == r["digest"]
            digests.add(r["digest"])
        assert len(digests) == 2
        assert latest(store, storage_options=options).url == entries[0].url

    def test_store_seed_workflow_keep_last_through_the_cli(
        self,
        base_url: str,
        storage_options: dict[str, Any],
        store_env: dict[str, str] | None,
        tmp_path: Path,
    ) -> None:
        if store_env is None:
            pytest.skip(
                f"{backend_of(self.location(base_url, storage_options))}:// cannot be reached "
                "from another process (no store_env): the CLI runs in a subprocess"
            )
        store = base_url + "store/"
        options = dict(storage_options)
        # Another run in the same store, which --keep-last of run "seed" must never touch.
        other = [
            pack(
                checkpoint(tmp_path / f"other-{s}", 20 + s),
                store,
                position=s,
                run="other",
                storage_options=options,
            ).url
            for s in (1, 2)
        ]
        previous: str | None = None
        for step in (1, 2, 3):
            source = checkpoint(tmp_path / f"seed-{step}", 30 + step)
            with self.watching(store, "seed") as seen:
                proc = run_cli(
                    store_env,
                    "pack",
                    str(source),
                    store,
                    "--run",
                    "seed",
                    "--step",
                    str(step),
                    "--keep-last",
                    "1",
                    "--json",
                )
            assert proc.returncode == 0, proc.stderr
            result = json.loads(proc.stdout)
            assert result["pruned"] == ([previous] if previous else [])
            name = result["url"][len(store) :]
            if previous is not None:
                # Never without a complete restore point of the run: the new one is
                # published before the old one goes.
                assert all(seen), seen
                old = previous[len(store) :]
                assert all(old in names or name in names for names in seen), seen
            assert seen[-1] == [name]
            entries = list_store(store, run="seed", storage_options=options)
            assert [(e.url, e.step) for e in entries] == [(result["url"], step)]
            assert verify(result["url"], storage_options=options).manifest.id == result["id"]
            assert [
                e.url for e in list_store(store, run="other", storage_options=options)
            ] == other[::-1]
            previous = result["url"]
        assert previous is not None
        assert self.raw_list(store) == sorted(
            [previous[len(store) :], *(u[len(store) :] for u in other)]
        )
        latest_proc = run_cli(store_env, "latest", store, "--run", "seed", "--verify")
        assert latest_proc.returncode == 0, latest_proc.stderr
        assert latest_proc.stdout.strip() == previous

    def test_store_prune_one_run_only(
        self, base_url: str, storage_options: dict[str, Any], tmp_path: Path
    ) -> None:
        store = base_url + "store/"
        options = dict(storage_options)
        src = checkpoint(tmp_path / "src", 6)
        # Full restore points: an incremental one keeps its base too (spec 28.5).
        a = [
            pack(src, store, position=s, run="run-a", storage_options=options, incremental=False)
            for s in (1, 2, 3)
        ]
        b = [
            pack(src, store, position=s, run="run-b", storage_options=options, incremental=False)
            for s in (1, 2)
        ]
        # Leftovers of writers that died (a PID that no longer runs) in both runs.
        gone = dead_pid()
        a_partial = f"run-a/{self.partial_name('y.rp', gone)}"
        b_partial = f"run-b/{self.partial_name('y.rp', gone)}"
        self.raw_put(store + a_partial, b"leftover")
        self.raw_put(store + b_partial, b"leftover")
        report = prune(
            store,
            keep_last=1,
            run="run-a",
            storage_options=options,
            now=time.time() + 2 * DEFAULT_GRACE_S,
        )
        assert [plan.run for plan in report.runs] == ["run-a"]
        assert report.deleted == [a[0].url, a[1].url]  # oldest first
        assert report.leftovers == [store + a_partial]
        assert [e.url for e in list_store(store, run="run-a", storage_options=options)] == [
            a[2].url
        ]
        assert [e.url for e in list_store(store, run="run-b", storage_options=options)] == [
            b[1].url,
            b[0].url,
        ]
        assert self.raw_list(store) == sorted(
            [b_partial, *(r.url[len(store) :] for r in (a[2], b[0], b[1]))]
        )
        # Without --run, every run: now run-b too.
        report = prune(
            store, keep_last=1, storage_options=options, now=time.time() + 2 * DEFAULT_GRACE_S
        )
        assert [plan.run for plan in report.runs] == ["run-a", "run-b"]
        assert (report.deleted, report.leftovers) == ([b[0].url], [store + b_partial])
        assert self.raw_list(store) == sorted(r.url[len(store) :] for r in (a[2], b[1]))
