"""The conformance suite of a storage backend on its own (``LocationConformance``): publish,
read and list, each guarantee of spec section "Storage" that the backend declares in its
``Abilities`` (those it does not are skipped with the reason). ``StoreConformance``
(``restorepoint.testing.store``) builds the suite of a store of restore points on it; the
fixtures and raw helpers a backend's subclass provides are described there."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import pytest

from ..errors import AlreadyExists, NotFound
from ..ops import pack, read_manifest, verify
from ..ops.verify import read_head_of
from ..storage import FsspecLocation, Location, is_partial_name, resolve

__all__ = ["NAME", "LocationConformance", "backend_of", "payload", "publish_and_fail", "read_all"]

#: The object every test publishes, under the base URL.
NAME = "restore.rp"


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` reproducible bytes; different seeds give different bytes."""
    return random.Random(seed).randbytes(size)  # noqa: S311 - test data, not a secret


class LocationConformance:
    """The tests every storage backend must pass: publish (atomic, create-only where
    declared), read back in ranges and streams, listing without stale caches. Subclass it for
    a backend (see the module docstring); ``StoreConformance`` adds the store on top."""

    #: How many bytes the tests of a publish in progress write before they look at the store.
    #: A backend that buffers (S3's multipart parts) sets it past its buffer, so that bytes
    #: really reach the store before the check.
    publish_size: int = 1 << 20

    # -- what a subclass provides -----------------------------------------------------------

    @pytest.fixture
    def base_url(self) -> str:
        raise NotImplementedError("a conformance subclass provides the base_url fixture")

    @pytest.fixture
    def storage_options(self) -> dict[str, Any]:
        return {}

    def raw_get(self, url: str) -> bytes:
        raise NotImplementedError

    def raw_put(self, url: str, data: bytes) -> None:
        raise NotImplementedError

    def raw_list(self, prefix: str) -> list[str]:
        raise NotImplementedError

    # -- helpers ----------------------------------------------------------------------------

    def location(self, url: str, storage_options: dict[str, Any]) -> Location:
        return resolve(url, dict(storage_options))

    def visible(self, prefix: str) -> list[str]:
        """What a listing shows as objects: everything but the partial names."""
        return [n for n in self.raw_list(prefix) if not is_partial_name(n.rsplit("/", 1)[-1])]

    def partials(self, prefix: str) -> list[str]:
        return [n for n in self.raw_list(prefix) if is_partial_name(n.rsplit("/", 1)[-1])]

    # -- publish and read back --------------------------------------------------------------

    def test_publish_then_read_back(self, base_url: str, storage_options: dict[str, Any]) -> None:
        url = base_url + NAME
        data = payload(300_007, seed=1)
        location = self.location(url, storage_options)
        with location.publish(size_hint=len(data)) as pub:
            # Uneven pieces: a publisher must not depend on how its writes are cut.
            for start, end in ((0, 1), (1, 65_536), (65_536, 65_537), (65_537, len(data))):
                pub.write(data[start:end])
        assert self.raw_get(url) == data
        assert self.raw_list(base_url) == [NAME]
        reader = location.reader()
        try:
            assert reader.size == len(data)
            assert reader.read_range(0, len(data)) == data
            assert reader.read_range(4_096, 70_000) == data[4_096:70_000]
            stream = reader.open_stream(123_456)
            try:
                assert read_all(stream) == data[123_456:]
            finally:
                stream.close()
        finally:
            reader.close()

    def test_publish_under_a_new_subdirectory(
        self, base_url: str, storage_options: dict[str, Any]
    ) -> None:
        url = base_url + "run-1/step-7/" + NAME
        data = payload(10_000, seed=2)
        with self.location(url, storage_options).publish() as pub:
            pub.write(data)
        assert self.raw_get(url) == data
        assert self.visible(base_url) == [f"run-1/step-7/{NAME}"]
        assert self.partials(base_url) == []

    def test_publish_replaces_only_at_commit(
        self, base_url: str, storage_options: dict[str, Any]
    ) -> None:
        url = base_url + NAME
        location = self.location(url, storage_options)
        abilities = location.abilities
        if not (abilities.atomic_rename or abilities.deferred_commit):
            pytest.skip(
                f"{backend_of(location)}:// declares neither atomic_rename nor deferred_commit: "
                "its publish is only as atomic as its move"
            )
        old, new = payload(5_000, seed=3), payload(self.publish_size, seed=4)
        self.raw_put(url, old)
        with location.publish(size_hint=len(new)) as pub:
            pub.write(new)
            assert self.raw_get(url) == old
            assert self.visible(base_url) == [NAME]
        assert self.raw_get(url) == new
        assert self.raw_list(base_url) == [NAME]

    @pytest.mark.parametrize("old_object", [True, False], ids=["replacing", "fresh"])
    @pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
    def test_failed_publish_leaves_no_trace(
        self,
        base_url: str,
        storage_options: dict[str, Any],
        failure: type[BaseException],
        old_object: bool,
    ) -> None:
        url = base_url + NAME
        old = payload(5_000, seed=5)
        if old_object:
            self.raw_put(url, old)
        location = self.location(url, storage_options)
        with pytest.raises(failure):
            publish_and_fail(
                location, payload(self.publish_size, seed=6), failure("stopped before the commit")
            )
        if old_object:
            assert self.raw_get(url) == old
            assert self.raw_list(base_url) == [NAME]
        else:
            assert self.raw_list(base_url) == []
            with pytest.raises(NotFound):
                location.reader()

    def test_create_only_refuses_to_replace(
        self, base_url: str, storage_options: dict[str, Any]
    ) -> None:
        url = base_url + NAME
        location = self.location(url, storage_options)
        if not location.abilities.create_only:
            pytest.skip(f"{backend_of(location)}:// does not declare create_only")
        first, second = payload(4_000, seed=7), payload(self.publish_size, seed=8)
        with location.publish(create_only=True) as pub:
            pub.write(first)
        assert self.raw_get(url) == first
        with pytest.raises(AlreadyExists) as info:
            publish_and_fail(location, second, None, create_only=True)
        assert isinstance(info.value, FileExistsError)
        assert info.value.url == url
        assert self.raw_get(url) == first
        # The refused publish cleans up after itself like any other failed one.
        assert self.raw_list(base_url) == [NAME]

    # -- reading ----------------------------------------------------------------------------

    def test_read_range_bounds(self, base_url: str, storage_options: dict[str, Any]) -> None:
        url = base_url + NAME
        data = payload(1_000, seed=9)
        self.raw_put(url, data)
        reader = self.location(url, storage_options).reader()
        try:
            assert reader.size == 1_000
            # read_range(start, end) is data[start:end], whatever the bounds.
            for start, end in (
                (0, 0),
                (500, 500),
                (990, 2_000),
                (0, 10**12),
                (999, 1_000),
                (1_000, 1_000),
                (1_000, 1_010),
                (2_000, 3_000),
                (10, 5),
            ):
                assert reader.read_range(start, end) == data[start:end], (start, end)
            stream = reader.open_stream(1_000)
            try:
                assert stream.read(10) == b""
            finally:
                stream.close()
        finally:
            reader.close()

    def test_empty_object(self, base_url: str, storage_options: dict[str, Any]) -> None:
        url = base_url + NAME
        location = self.location(url, storage_options)
        with location.publish():
            pass
        assert self.raw_get(url) == b""
        reader = location.reader()
        try:
            assert reader.size == 0
            assert reader.read_range(0, 10) == b""
        finally:
            reader.close()

    def test_reader_of_missing_url(self, base_url: str, storage_options: dict[str, Any]) -> None:
        url = base_url + "missing.rp"
        with pytest.raises(NotFound) as info:
            self.location(url, storage_options).reader()
        assert isinstance(info.value, FileNotFoundError)
        assert info.value.url == url
        assert self.raw_list(base_url) == []

    # -- through the operations -------------------------------------------------------------

    def test_pack_verify_read_manifest(
        self, base_url: str, storage_options: dict[str, Any], tmp_path: Path
    ) -> None:
        source = tmp_path / "checkpoint"
        (source / "optim").mkdir(parents=True)
        files = {
            "model.bin": payload(200_001, seed=10),
            "optim/state.bin": payload(70_000, seed=11),
            "empty": b"",
        }
        for name, data in files.items():
            (source / name).write_bytes(data)
        url = base_url + NAME
        result = pack(
            source,
            url,
            position=42,
            chunk_size=65_536,
            storage_options=dict(storage_options),
            object_sha256=True,
        )
        stored = self.raw_get(url)
        assert len(stored) == result.size
        assert hashlib.sha256(stored).hexdigest() == result.sha256
        report = verify(url, storage_options=dict(storage_options))
        assert (report.files, report.bytes, report.size) == (3, 270_001, result.size)
        assert report.digest == result.digest
        assert report.manifest.id == result.id
        manifest = read_manifest(url, storage_options=dict(storage_options))
        assert manifest.payload is not None
        assert {e.path: e.size for e in manifest.payload} == {
            name: len(data) for name, data in files.items()
        }
        assert {e.path: e.sha256 for e in manifest.payload} == {
            name: hashlib.sha256(data).hexdigest() for name, data in files.items()
        }
        head = read_head_of(url, storage_options=dict(storage_options))
        assert head.manifest.position.step == 42
        assert head.manifest.payload is None
        assert self.raw_list(base_url) == [NAME]

    # -- caches -----------------------------------------------------------------------------

    def test_iter_objects_streams_the_listing_grouped_by_top_name(
        self, base_url: str, storage_options: dict[str, Any]
    ) -> None:
        """``iter_objects`` yields what ``list_objects`` lists, each top-level name's objects
        together and in name order (fsck holds one group at a time)."""
        prefix = base_url + "it/"
        names = ["a-b", "a/x", "a/y/z", "a.c/q", "b", "b0/1", "b0/0"]
        for i, name in enumerate(names):
            self.raw_put(prefix + name, payload(10 + i, seed=i))
        location = self.location(prefix, storage_options)
        streamed = [o.name for o in location.iter_objects()]
        assert sorted(streamed) == sorted(names)
        assert [o.name for o in location.list_objects()] == sorted(names)
        tops = [n.partition("/")[0] for n in streamed]
        for top in set(tops):
            run = [i for i, t in enumerate(tops) if t == top]
            assert run == list(range(run[0], run[-1] + 1)), streamed  # together
            group = [streamed[i] for i in run]
            assert group == sorted(group), streamed

    def test_listing_cache_never_hides_a_new_object(
        self, base_url: str, storage_options: dict[str, Any]
    ) -> None:
        import fsspec.core

        url = base_url + NAME
        old, new = payload(1_000, seed=12), payload(3_000, seed=13)
        self.raw_put(url, old)
        first = self.location(url, storage_options)
        if isinstance(first, FsspecLocation):
            # Fill the first instance's listing cache with the old object.
            parent = first.path.rsplit("/", 1)[0]
            assert any(e["name"].endswith(NAME) for e in first.fs.ls(parent, detail=True))
        reader = first.reader()
        try:
            assert reader.size == len(old)
        finally:
            reader.close()
        # Another process (here: another filesystem instance, with caches of its own)
        # publishes a new object under the same name.
        fs2, path2 = fsspec.core.url_to_fs(url, skip_instance_cache=True, **storage_options)
        backend = type(first) if isinstance(first, FsspecLocation) else FsspecLocation
        with backend(url, fs2, path2).publish() as pub:
            pub.write(new)
        assert self.raw_get(url) == new
        again = self.location(url, storage_options)
        if isinstance(first, FsspecLocation):
            assert isinstance(again, FsspecLocation)
            assert again.fs is first.fs, "the test must read through the first, cached instance"
        reader = again.reader()
        try:
            assert reader.size == len(new)
            assert reader.read_range(0, len(new)) == new
            stream = reader.open_stream(0)
            try:
                assert read_all(stream) == new
            finally:
                stream.close()
        finally:
            reader.close()


def backend_of(location: Location) -> str:
    """The backend a location is on, by its protocol (how a skip names it)."""
    return location.protocol


def read_all(stream: Any, piece: int = 50_000) -> bytes:
    """Everything left in ``stream``, read in pieces as the payload decoder does."""
    return b"".join(iter(lambda: stream.read(piece), b""))


def publish_and_fail(
    location: Location, data: bytes, failure: BaseException | None, *, create_only: bool = False
) -> None:
    """Publish ``data`` and raise ``failure`` inside the block, before the commit (``None``:
    let the block end normally, so that the commit itself may fail)."""
    with location.publish(size_hint=len(data), create_only=create_only) as pub:
        pub.write(data)
        if failure is not None:
            raise failure
