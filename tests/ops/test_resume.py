"""The one way in (spec section 16): the strict rule, views and their sources, choosing the
run's restore point to resume from (no silent fallback to an older one), the gated import
for a resume, and the data digest a local view computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import Expectations, IncompatibleRestorePoint, SignatureError, Trainer
from restorepoint.ops.gate import UNSET, mismatches
from restorepoint.ops.local_view import data_digest
from restorepoint.ops.resume import choose, read_head_file, resume_import, write_head_file

CONFIG = {"lr": 0.1, "train": {"every": 5}}
HEAD: dict[str, Any] = {
    "trainer": ("t", "1"),
    "terms": {"torch": "2.13.0"},
    "config": CONFIG,
    "operational_keys": ["train.every"],
    "cache_keys": {"data": "sha256:" + "a" * 64},
    "cache_root": "/cache",
    "run": "r1",
}


def here(**changes: Any) -> Expectations:
    """A view that knows everything the restore points below record."""
    values: dict[str, Any] = {
        "trainer": Trainer("t", "1"),
        "terms": {"torch": "2.13.0"},
        "config": {"lr": 0.1},
        "cache_keys": {"data": "sha256:" + "a" * 64},
        "cache_root": "/cache",
    }
    values.update(changes)
    return Expectations(**values, sources={"terms": "detected"})


def publish(tmp_path: Path, store: str, step: int, **changes: Any) -> str:
    source = tmp_path / f"src-{step}"
    source.mkdir(exist_ok=True)
    (source / "state.bin").write_bytes(bytes([step]) * 100)
    head = {**HEAD, **changes}
    return restorepoint.pack(source, store, position=step, **head).url


def test_the_strict_rule_refuses_what_no_view_knows(tmp_path: Path) -> None:
    url = publish(tmp_path, f"{tmp_path / 's'}/", 1)
    head = restorepoint.read_manifest(url, head_only=True)
    assert mismatches(head, here(), strict=True) == []
    found = mismatches(head, here(cache_root=UNSET, config=UNSET), strict=True)
    assert [(m.field, m.unknown) for m in found] == [("cache_root", True), ("config", True)]
    assert found[0].describe() == (
        "cache_root: unknown here (give --cache-root, --expect, RESTOREPOINT_CACHE_ROOT or an "
        "adapter); in the restore point /cache"
    )
    # Lenient (a plain gate): not known is not checked. Deferred: a later gate compares.
    assert mismatches(head, here(cache_root=UNSET, config=UNSET)) == []
    assert mismatches(head, here(config=UNSET), strict=True, defer={"config"}) == []


def test_every_view_must_be_met_and_each_names_its_source(tmp_path: Path) -> None:
    url = publish(tmp_path, f"{tmp_path / 's'}/", 1)
    head = restorepoint.read_manifest(url, head_only=True)
    handoff = Expectations(terms={"torch": "2.12.0"}, sources={"terms": "--expect"})
    found = mismatches(head, here(), handoff, strict=True)
    assert [(m.field, m.source) for m in found] == [("terms.torch", "--expect")]
    assert found[0].describe() == "terms.torch: here 2.12.0 (--expect), in the restore point 2.13.0"


def test_merged_keeps_each_names_source() -> None:
    detected = Expectations(terms={"torch": "2.13.0", "cuda": "12.4"}, sources={"terms": "det"})
    out = detected.merged(Expectations(terms={"cuda": "12.1"}, sources={"terms": "--term"}))
    assert out.terms == {"torch": "2.13.0", "cuda": "12.1"}
    assert (out.source("terms.cuda"), out.source("terms.torch")) == ("--term", "det")


def test_choose_returns_the_newest_that_passes(tmp_path: Path) -> None:
    store = f"{tmp_path / 's'}/"
    publish(tmp_path, store, 1)
    newest = publish(tmp_path, store, 2)
    entry = choose(store, run="r1", views=[here()])
    assert entry is not None and entry.url == newest
    assert choose(store, run="other", views=[here()]) is None


def test_choose_never_falls_back_silently(tmp_path: Path) -> None:
    store = f"{tmp_path / 's'}/"
    older = publish(tmp_path, store, 1)
    publish(tmp_path, store, 2, terms={"torch": "1.0.0"})
    with pytest.raises(IncompatibleRestorePoint) as info:
        choose(store, run="r1", views=[here()])
    assert info.value.message.startswith("the newest restore point of run r1 is refused")
    assert "that would pass here: step 1" in info.value.details[-1]
    entry = choose(store, run="r1", views=[here()], accept_older=True)
    assert entry is not None and entry.url == older


def test_choose_with_nothing_passing_says_so(tmp_path: Path) -> None:
    store = f"{tmp_path / 's'}/"
    publish(tmp_path, store, 1, terms={"torch": "1.0.0"})
    with pytest.raises(IncompatibleRestorePoint) as info:
        choose(store, run="r1", views=[here()], accept_older=True)
    assert info.value.details[-1] == "no older restore point of run r1 passes here either"


def test_choose_under_a_trust_policy_refuses_an_unsigned_newest(tmp_path: Path) -> None:
    assert restorepoint.trust.generate(tmp_path / "key", "signing")
    key = restorepoint.trust.load_signing_key(tmp_path / "key")
    store = f"{tmp_path / 's'}/"
    signed = publish(tmp_path, store, 1, sign=[key])
    publish(tmp_path, store, 2)
    policy = restorepoint.Trust(
        trusted=(restorepoint.trust.load_public(tmp_path / "key.pub", "signing").raw,),
        require_signature=True,
    )
    with pytest.raises(SignatureError, match="that would pass here: step 1"):
        choose(store, run="r1", views=[here()], trust=policy)
    entry = choose(store, run="r1", views=[here()], trust=policy, accept_older=True)
    assert entry is not None and entry.url == signed


def test_resume_import_is_strict_and_writes_nothing_on_refusal(tmp_path: Path) -> None:
    url = publish(tmp_path, f"{tmp_path / 's'}/", 1)
    dest = tmp_path / "dest"
    with pytest.raises(IncompatibleRestorePoint):
        resume_import(url, dest, views=[here(cache_keys=UNSET)])
    assert not dest.exists()
    result = resume_import(url, dest, views=[here()])
    assert result.gated and (dest / "state.bin").exists()


def test_the_head_file_round_trips_and_a_missing_one_cannot_be_gated(tmp_path: Path) -> None:
    url = publish(tmp_path, f"{tmp_path / 's'}/", 1)
    head = restorepoint.read_manifest(url, head_only=True)
    write_head_file(head, tmp_path / "head.json")
    assert read_head_file(tmp_path / "head.json") == head
    with pytest.raises(IncompatibleRestorePoint, match="cannot be gated"):
        read_head_file(tmp_path / "missing.json")


# -- the data digest ---------------------------------------------------------------------------


def tree(root: Path) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(b"a" * 1000)
    (root / "images" / "b.png").write_bytes(b"b" * 10)
    (root / "cameras.txt").write_text("1 2 3\n")
    return root


def test_the_data_digest_is_of_the_contents_and_the_names(tmp_path: Path) -> None:
    a = tree(tmp_path / "a")
    b = tree(tmp_path / "b")
    digest = data_digest(a)
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert data_digest(b) == digest  # where it lies does not matter
    (b / "images" / "b.png").write_bytes(b"B" * 10)
    assert data_digest(b) != digest
    b = tree(tmp_path / "c")
    (b / "images" / "b.png").rename(b / "images" / "c.png")
    assert data_digest(b) != digest
    b = tree(tmp_path / "d")
    (b / "extra").write_bytes(b"")
    assert data_digest(b) != digest
    # A newline in a name cannot forge the listing of other files.
    odd = tmp_path / "e"
    odd.mkdir()
    (odd / "x\n0 y").write_bytes(b"")
    plain = tmp_path / "f"
    plain.mkdir()
    (plain / "x").write_bytes(b"")
    assert data_digest(odd) != data_digest(plain)


def test_the_data_digest_of_one_file_and_of_nothing(tmp_path: Path) -> None:
    (tmp_path / "one.bin").write_bytes(b"x")
    assert data_digest(tmp_path / "one.bin").startswith("sha256:")
    with pytest.raises(restorepoint.NotFound):
        data_digest(tmp_path / "missing")
