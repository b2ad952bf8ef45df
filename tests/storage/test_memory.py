"""The store suite on fsspec's memory filesystem: the staged publish (temporary name, then a
move) that every backend without atomic rename or deferred commit gets."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest

from restorepoint.storage import Abilities, resolve
from restorepoint.testing.store import LocationConformance, StoreConformance


def _memory() -> fsspec.AbstractFileSystem:
    return fsspec.filesystem("memory")


def _path(url: str) -> str:
    return "/" + url.removeprefix("memory://").lstrip("/")


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    def base_url(self) -> Iterator[str]:
        # The memory store is one dict per process: a fresh prefix per test, removed after.
        root = f"rp-store-{uuid.uuid4().hex}"
        yield f"memory://{root}/"
        fs = _memory()
        if fs.exists(f"/{root}"):
            fs.rm(f"/{root}", recursive=True)

    def raw_get(self, url: str) -> bytes:
        return bytes(_memory().cat_file(_path(url)))

    def raw_put(self, url: str, data: bytes) -> None:
        _memory().pipe_file(_path(url), data)

    def raw_list(self, prefix: str) -> list[str]:
        root = _path(prefix).rstrip("/")
        fs = _memory()
        found = fs.find(root, withdirs=False) if fs.exists(root) else []
        # find() gives paths with or without the leading slash, depending on the version.
        return sorted(("/" + p.lstrip("/")).removeprefix(root + "/") for p in found)


def test_memory_location_declares_no_atomic_ability() -> None:
    abilities = resolve("memory://rp-store-abilities/x.rp").abilities
    assert abilities == Abilities()


def test_the_location_suite_stands_alone_and_the_store_suite_builds_on_it() -> None:
    location_tests = {n for n in dir(LocationConformance) if n.startswith("test_")}
    store_tests = {n for n in dir(StoreConformance) if n.startswith("test_")}
    # A backend author can run the location suite alone: it needs no store and no CLI.
    assert location_tests and not any(n.startswith("test_store_") for n in location_tests)
    assert "store_env" not in vars(LocationConformance)
    assert location_tests < store_tests
    assert all(n.startswith("test_store_") for n in store_tests - location_tests)
