"""The import gate (spec section 16) and handoff files (section 17), on real restore points packed
to local disk: every expectation alone, several at once in the documented order, the config by
identity with the restore point's operational keys, handoff round trips and broken handoffs,
and that the gate decides from the head alone and writes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import (
    ConfigError,
    DigestMismatch,
    Expectations,
    IncompatibleRestorePoint,
    IntegrityError,
    NotARestorePoint,
    NotFound,
    Trainer,
    config_identity,
)
from restorepoint.ops.gate import UNSET, mismatches
from restorepoint.ops.handoff import HANDOFF_FORMAT

CONFIG: dict[str, Any] = {
    "lr": 0.001,
    "model": {"width": 64, "heads": 4},
    "train": {"checkpoint_every": 500, "epochs": 3},
}
OPERATIONAL = ["train.checkpoint_every"]
TERMS = {"cuda": "12.4", "torch": "2.13.0"}
KEYS = {"dataset": "tok-v3", "vocab": "bpe-32k"}
ROOT = "/cache/run-1"


def tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.bin").write_bytes(bytes(range(256)) * 64)
    (root / "sub" / "state.json").write_bytes(b'{"step": 7}')
    return root


def pack(tmp_path: Path, name: str = "rp.rpt", **head: Any) -> tuple[str, restorepoint.Manifest]:
    identity: dict[str, Any] = {
        "trainer": ("fake-trainer", "1.0.0"),
        "terms": TERMS,
        "config": CONFIG,
        "operational_keys": OPERATIONAL,
        "cache_keys": KEYS,
        "cache_root": ROOT,
    }
    identity.update(head)
    source = tmp_path / f"src-{name}"
    if not source.exists():
        tree(source)
    dest = tmp_path / "store" / name
    result = restorepoint.pack(source, str(dest), position=7, chunk_size=65536, **identity)
    return str(dest), result.manifest


@pytest.fixture
def rp(tmp_path: Path) -> tuple[str, restorepoint.Manifest]:
    return pack(tmp_path)


@pytest.fixture
def bare(tmp_path: Path) -> tuple[str, restorepoint.Manifest]:
    """A restore point that records no trainer, terms, cache keys, cache root or config."""
    return pack(
        tmp_path,
        "bare.rpt",
        trainer=None,
        terms={},
        config=None,
        operational_keys=[],
        cache_keys={},
        cache_root=None,
    )


def everything() -> Expectations:
    """Every expectation, each met by ``rp``."""
    return Expectations(
        trainer=Trainer("fake-trainer", "1.0.0"),
        terms=dict(TERMS),
        cache_keys=dict(KEYS),
        cache_root=ROOT,
        config=json.loads(json.dumps(CONFIG)),
    )


def refused(url: str, expect: Expectations) -> list[dict[str, Any]]:
    """The mismatches as data, from the refusal that check() raises."""
    with pytest.raises(IncompatibleRestorePoint) as info:
        restorepoint.check(url, expect)
    assert info.value.exit_code == 3
    assert info.value.url == url
    return list(info.value.mismatches)


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` with its mode, size and mtime: what a writer would change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (
                st.st_mode,
                st.st_size,
                st.st_mtime_ns,
            )
    return out


# -- every field alone ------------------------------------------------------------------------


def test_every_expectation_met_is_compatible(rp: tuple[str, restorepoint.Manifest]) -> None:
    url, manifest = rp
    result = restorepoint.check(url, everything())
    assert result.compatible
    assert result.mismatches == []
    assert result.manifest.id == manifest.id
    assert result.to_dict() == {
        "compatible": True,
        "gated": True,
        "id": manifest.id,
        "mismatches": [],
        "ok": True,
        "position": {"step": 7},
        "url": url,
    }


def test_no_expectation_accepts_any_sound_restore_point(
    rp: tuple[str, restorepoint.Manifest], bare: tuple[str, restorepoint.Manifest]
) -> None:
    assert Expectations().empty
    assert restorepoint.check(rp[0], Expectations()).compatible
    assert restorepoint.check(bare[0], Expectations()).compatible


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        pytest.param(Trainer("other-trainer", "1.0.0"), "other-trainer=1.0.0", id="name"),
        pytest.param(Trainer("fake-trainer", "1.0.1"), "fake-trainer=1.0.1", id="version"),
        pytest.param(Trainer("fake-trainer", "1.0"), "fake-trainer=1.0", id="version-prefix"),
        pytest.param(None, None, id="expected-none"),
    ],
)
def test_trainer_alone(
    rp: tuple[str, restorepoint.Manifest], trainer: Trainer | None, expected: str | None
) -> None:
    found = refused(rp[0], Expectations(trainer=trainer))
    assert found == [{"field": "trainer", "expected": expected, "found": "fake-trainer=1.0.0"}]


def test_trainer_expected_where_none_is_recorded(bare: tuple[str, restorepoint.Manifest]) -> None:
    found = refused(bare[0], Expectations(trainer=Trainer("fake-trainer", "1.0.0")))
    assert found == [{"field": "trainer", "expected": "fake-trainer=1.0.0", "found": None}]
    assert restorepoint.check(bare[0], Expectations(trainer=None)).compatible


@pytest.mark.parametrize("name", sorted(TERMS))
def test_each_term_alone(rp: tuple[str, restorepoint.Manifest], name: str) -> None:
    terms = {**TERMS, name: TERMS[name] + ".1"}
    found = refused(rp[0], Expectations(terms=terms))
    assert found == [
        {"field": f"terms.{name}", "expected": TERMS[name] + ".1", "found": TERMS[name]}
    ]


def test_term_missing_on_the_restore_point(rp: tuple[str, restorepoint.Manifest]) -> None:
    found = refused(rp[0], Expectations(terms={**TERMS, "nccl": "2.21"}))
    assert found == [{"field": "terms.nccl", "expected": "2.21"}]  # no "found": absent


def test_term_only_on_the_restore_point(rp: tuple[str, restorepoint.Manifest]) -> None:
    # Terms are a whole map: a term the importer does not expect is a mismatch too.
    found = refused(rp[0], Expectations(terms={"torch": "2.13.0"}))
    assert found == [{"field": "terms.cuda", "found": "12.4"}]  # no "expected": absent


def test_expected_empty_terms_refuse_every_recorded_term(
    rp: tuple[str, restorepoint.Manifest], bare: tuple[str, restorepoint.Manifest]
) -> None:
    found = refused(rp[0], Expectations(terms={}))
    assert found == [
        {"field": "terms.cuda", "found": "12.4"},
        {"field": "terms.torch", "found": "2.13.0"},
    ]
    assert restorepoint.check(bare[0], Expectations(terms={}, cache_keys={})).compatible


@pytest.mark.parametrize("name", sorted(KEYS))
def test_each_cache_key_alone(rp: tuple[str, restorepoint.Manifest], name: str) -> None:
    keys = {**KEYS, name: "other"}
    found = refused(rp[0], Expectations(cache_keys=keys))
    assert found == [{"field": f"cache_keys.{name}", "expected": "other", "found": KEYS[name]}]


def test_cache_keys_missing_on_either_side(rp: tuple[str, restorepoint.Manifest]) -> None:
    found = refused(rp[0], Expectations(cache_keys={"dataset": "tok-v3", "shards": "16"}))
    assert found == [
        {"field": "cache_keys.shards", "expected": "16"},
        {"field": "cache_keys.vocab", "found": "bpe-32k"},
    ]


@pytest.mark.parametrize(
    ("cache_root", "expected"),
    [
        pytest.param("/cache/run-2", "/cache/run-2", id="other"),
        pytest.param("/cache/run-1/", "/cache/run-1/", id="trailing-slash"),
        pytest.param(None, None, id="expected-none"),
    ],
)
def test_cache_root_alone(
    rp: tuple[str, restorepoint.Manifest], cache_root: str | None, expected: str | None
) -> None:
    found = refused(rp[0], Expectations(cache_root=cache_root))
    assert found == [{"field": "cache_root", "expected": expected, "found": ROOT}]


def test_cache_root_expected_where_none_is_recorded(
    bare: tuple[str, restorepoint.Manifest],
) -> None:
    found = refused(bare[0], Expectations(cache_root=ROOT))
    assert found == [{"field": "cache_root", "expected": ROOT, "found": None}]
    assert restorepoint.check(bare[0], Expectations(cache_root=None)).compatible


def test_learning_rate_changed_is_refused_by_name(rp: tuple[str, restorepoint.Manifest]) -> None:
    config = {**CONFIG, "lr": 0.0003}
    with pytest.raises(IncompatibleRestorePoint) as info:
        restorepoint.check(rp[0], Expectations(config=config))
    assert info.value.mismatches == [{"field": "config.lr", "expected": 0.0003, "found": 0.001}]
    assert info.value.details == ["config.lr: here 0.0003, in the restore point 0.001"]
    assert "config.lr" in str(info.value)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({**CONFIG, "train": {"checkpoint_every": 100, "epochs": 3}}, id="changed"),
        pytest.param({**CONFIG, "train": {"epochs": 3}}, id="removed"),
    ],
)
def test_operational_key_changed_is_accepted(
    rp: tuple[str, restorepoint.Manifest], config: dict[str, Any]
) -> None:
    # The identity is computed with the restore point's operational keys, not the importer's.
    result = restorepoint.check(rp[0], Expectations(config=config))
    assert result.compatible


def test_non_operational_key_beside_an_operational_one_is_refused(
    rp: tuple[str, restorepoint.Manifest],
) -> None:
    config = {**CONFIG, "train": {"checkpoint_every": 100, "epochs": 4}}
    assert refused(rp[0], Expectations(config=config)) == [
        {"field": "config.train.epochs", "expected": 4, "found": 3}
    ]


def test_nested_config_keys_added_and_removed(rp: tuple[str, restorepoint.Manifest]) -> None:
    config = json.loads(json.dumps(CONFIG))
    config["model"]["depth"] = 12  # only in the expected config
    del config["model"]["heads"]  # only in the restore point's
    config["optim"] = {"beta": {"one": 0.9}}  # a whole section only expected
    found = refused(rp[0], Expectations(config=config))
    assert found == [
        {"field": "config.model.depth", "expected": 12},
        {"field": "config.model.heads", "found": 4},
        {"field": "config.optim", "expected": {"beta": {"one": 0.9}}},
    ]


def test_config_leaf_of_another_type_and_arrays_compare_whole(tmp_path: Path) -> None:
    url, _ = pack(tmp_path, config={"layers": [1, 2, 3], "model": {"width": 64}, "lr": 1.0})
    assert restorepoint.check(
        url, Expectations(config={"layers": [1, 2, 3], "model": {"width": 64}, "lr": 1})
    ).compatible
    found = refused(url, Expectations(config={"layers": [1, 2], "model": 64, "lr": 1.0}))
    assert found == [
        {"field": "config.layers", "expected": [1, 2], "found": [1, 2, 3]},
        {"field": "config.model", "expected": 64, "found": {"width": 64}},
    ]


def test_config_expected_where_none_is_recorded(bare: tuple[str, restorepoint.Manifest]) -> None:
    found = refused(bare[0], Expectations(config=CONFIG))
    assert found == [
        {
            "field": "config_identity",
            "expected": config_identity(CONFIG, []),
            "found": None,
        }
    ]


def test_config_identity_alone(rp: tuple[str, restorepoint.Manifest]) -> None:
    url, manifest = rp
    assert restorepoint.check(
        url, Expectations(config_identity=manifest.config_identity)
    ).compatible
    other = "0" * 64
    assert refused(url, Expectations(config_identity=other)) == [
        {"field": "config_identity", "expected": other, "found": manifest.config_identity}
    ]
    assert refused(url, Expectations(config_identity=None)) == [
        {"field": "config_identity", "expected": None, "found": manifest.config_identity}
    ]


def test_config_wins_over_config_identity(rp: tuple[str, restorepoint.Manifest]) -> None:
    # Both given: the config is compared (it names keys), the identity is not.
    expect = Expectations(config=CONFIG, config_identity="0" * 64)
    assert restorepoint.check(rp[0], expect).compatible


# -- several at once --------------------------------------------------------------------------


def test_every_mismatch_is_listed_in_the_documented_order(
    rp: tuple[str, restorepoint.Manifest],
) -> None:
    expect = Expectations(
        config={**CONFIG, "lr": 0.01},
        cache_keys={"dataset": "tok-v4", "vocab": "bpe-32k"},
        cache_root="/elsewhere",
        terms={"torch": "2.12.0", "nccl": "2.21"},
        trainer=Trainer("fake-trainer", "2.0.0"),
    )
    found = refused(rp[0], expect)
    assert [m["field"] for m in found] == [
        "trainer",
        "terms.cuda",
        "terms.nccl",
        "terms.torch",
        "cache_root",
        "cache_keys.dataset",
        "config.lr",
    ]
    assert found == [
        {"field": "trainer", "expected": "fake-trainer=2.0.0", "found": "fake-trainer=1.0.0"},
        {"field": "terms.cuda", "found": "12.4"},
        {"field": "terms.nccl", "expected": "2.21"},
        {"field": "terms.torch", "expected": "2.12.0", "found": "2.13.0"},
        {"field": "cache_root", "expected": "/elsewhere", "found": ROOT},
        {"field": "cache_keys.dataset", "expected": "tok-v4", "found": "tok-v3"},
        {"field": "config.lr", "expected": 0.01, "found": 0.001},
    ]


def test_refusal_carries_one_line_per_mismatch(rp: tuple[str, restorepoint.Manifest]) -> None:
    expect = Expectations(terms={"torch": "2.13.0", "nccl": "2.21"}, cache_root=None)
    with pytest.raises(IncompatibleRestorePoint) as info:
        restorepoint.check(rp[0], expect)
    assert info.value.details == [
        "terms.cuda: here (absent), in the restore point 12.4",
        "terms.nccl: here 2.21, in the restore point (absent)",
        f"cache_root: here (none), in the restore point {ROOT}",
    ]
    assert str(info.value) == (
        f"{rp[0]}: refused: 3 expectations not met (terms.cuda, terms.nccl, cache_root)"
    )
    error = info.value.to_dict()
    assert error["class"] == "IncompatibleRestorePoint"
    assert error["exit_code"] == 3
    assert error["mismatches"] == info.value.mismatches


def test_raise_on_mismatch_false_returns_the_decision(
    rp: tuple[str, restorepoint.Manifest],
) -> None:
    result = restorepoint.check(rp[0], Expectations(cache_root="/x"), raise_on_mismatch=False)
    assert not result.compatible
    assert [m.to_dict() for m in result.mismatches] == [
        {"field": "cache_root", "expected": "/x", "found": ROOT}
    ]
    assert result.to_dict()["ok"] is False
    assert result.to_dict()["mismatches"] == [m.to_dict() for m in result.mismatches]


def test_mismatches_needs_only_the_head(rp: tuple[str, restorepoint.Manifest]) -> None:
    head = restorepoint.ops.read_head_of(rp[0]).manifest
    assert head.payload is None
    assert mismatches(head, everything()) == []
    assert [m.field for m in mismatches(head, Expectations(terms={}))] == [
        "terms.cuda",
        "terms.torch",
    ]


# -- Expectations.merged: the command line over the file --------------------------------------


def test_merged_replaces_whole_fields() -> None:
    base = everything()
    top = Expectations(trainer=Trainer("t", "2"), cache_root=None)
    out = base.merged(top)
    assert out.trainer == Trainer("t", "2")
    assert out.cache_root is None  # an expected None overrides, it is not "unset"
    assert out.terms == TERMS
    assert out.config == CONFIG


def test_merged_merges_terms_and_keys_by_name() -> None:
    base = Expectations(terms={"cuda": "12.4", "torch": "2.13.0"}, cache_keys={"dataset": "a"})
    out = base.merged(Expectations(terms={"cuda": "12.6", "nccl": "2.21"}, cache_keys={"v": "b"}))
    assert out.terms == {"cuda": "12.6", "nccl": "2.21", "torch": "2.13.0"}
    assert out.cache_keys == {"dataset": "a", "v": "b"}
    # Onto unset terms, the override is the whole map.
    assert Expectations().merged(Expectations(terms={"cuda": "1"})).terms == {"cuda": "1"}


def test_merged_config_drops_the_files_config_identity() -> None:
    base = Expectations(config_identity="a" * 64)
    out = base.merged(Expectations(config={"lr": 1}))
    assert out.config == {"lr": 1}
    assert out.config_identity is UNSET


def test_merged_config_identity_drops_the_files_config(
    rp: tuple[str, restorepoint.Manifest],
) -> None:
    out = everything().merged(Expectations(config_identity="0" * 64))
    assert out.config is UNSET
    assert out.config_identity == "0" * 64
    assert [m["field"] for m in refused(rp[0], out)] == ["config_identity"]


def test_merged_leaves_unset_fields_alone() -> None:
    base = everything()
    assert base.merged(Expectations()) == base
    assert base.merged(Expectations()).to_dict() == {
        "cache_keys": KEYS,
        "cache_root": ROOT,
        "config": CONFIG,
        "terms": TERMS,
        "trainer": {"name": "fake-trainer", "version": "1.0.0"},
    }


# -- handoff files ----------------------------------------------------------------------------


def test_handoff_round_trip(tmp_path: Path, rp: tuple[str, restorepoint.Manifest]) -> None:
    url, manifest = rp
    path = tmp_path / "handoff.json"
    restorepoint.write_handoff(path, restorepoint.handoff_document(manifest, url))
    document = json.loads(path.read_text("utf-8"))
    assert document == {
        "cache_keys": KEYS,
        "cache_root": ROOT,
        "config": CONFIG,
        "config_identity": manifest.config_identity,
        "handoff": HANDOFF_FORMAT,
        "id": manifest.id,
        "operational_keys": OPERATIONAL,
        "position": {"step": 7},
        "terms": TERMS,
        "trainer": {"name": "fake-trainer", "version": "1.0.0"},
        "url": url,
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
    expect = restorepoint.load_expectations(path)
    assert expect == everything()
    assert restorepoint.check(url, expect).compatible


def test_handoff_of_a_bare_restore_point_expects_nothing_recorded(
    tmp_path: Path,
    rp: tuple[str, restorepoint.Manifest],
    bare: tuple[str, restorepoint.Manifest],
) -> None:
    path = tmp_path / "bare.json"
    restorepoint.write_handoff(path, restorepoint.handoff_document(bare[1], bare[0]))
    expect = restorepoint.load_expectations(path)
    assert expect == Expectations(
        trainer=None, terms={}, cache_keys={}, cache_root=None, config_identity=None
    )
    assert restorepoint.check(bare[0], expect).compatible
    # The same file against a restore point that records everything: each is a mismatch.
    assert [m["field"] for m in refused(rp[0], expect)] == [
        "trainer",
        "terms.cuda",
        "terms.torch",
        "cache_root",
        "cache_keys.dataset",
        "cache_keys.vocab",
        "config_identity",
    ]


def test_handoff_with_identity_but_no_config(
    tmp_path: Path, rp: tuple[str, restorepoint.Manifest]
) -> None:
    url, manifest = rp
    document = restorepoint.handoff_document(manifest, url)
    del document["config"]
    path = tmp_path / "h.json"
    path.write_text(json.dumps(document), "utf-8")
    expect = restorepoint.load_expectations(path)
    assert expect.config is UNSET
    assert expect.config_identity == manifest.config_identity
    assert restorepoint.check(url, expect).compatible
    document["config_identity"] = "f" * 64
    path.write_text(json.dumps(document), "utf-8")
    assert refused(url, restorepoint.load_expectations(path)) == [
        {"field": "config_identity", "expected": "f" * 64, "found": manifest.config_identity}
    ]


def test_handoff_members_absent_are_not_expected(
    tmp_path: Path, rp: tuple[str, restorepoint.Manifest]
) -> None:
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"handoff": HANDOFF_FORMAT, "terms": {"cuda": "12.4"}}), "utf-8")
    expect = restorepoint.load_expectations(path)
    assert expect == Expectations(terms={"cuda": "12.4"})
    assert refused(rp[0], expect) == [{"field": "terms.torch", "found": "2.13.0"}]
    # Informational and unknown members are ignored.
    path.write_text(
        json.dumps({"handoff": HANDOFF_FORMAT, "id": "x", "url": 5, "x_later": [1]}), "utf-8"
    )
    assert restorepoint.load_expectations(path).empty


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{not json", id="bad-json"),
        pytest.param("", id="empty"),
        pytest.param("[]", id="not-an-object"),
        pytest.param('{"terms": {}}', id="no-marker"),
        pytest.param('{"handoff": "restorepoint-handoff/2"}', id="other-marker"),
        pytest.param('{"handoff": 1}', id="marker-not-a-string"),
        pytest.param('{"handoff": "H", "trainer": "fake-trainer=1.0.0"}', id="trainer-string"),
        pytest.param('{"handoff": "H", "trainer": {"name": "t"}}', id="trainer-no-version"),
        pytest.param('{"handoff": "H", "trainer": {"name": "t", "version": 1}}', id="trainer-int"),
        pytest.param('{"handoff": "H", "terms": ["cuda"]}', id="terms-list"),
        pytest.param('{"handoff": "H", "terms": {"cuda": 12.4}}', id="term-number"),
        pytest.param('{"handoff": "H", "cache_keys": {"a": null}}', id="key-null"),
        pytest.param('{"handoff": "H", "cache_root": 5}', id="cache-root-int"),
        pytest.param('{"handoff": "H", "config": [1]}', id="config-list"),
        pytest.param('{"handoff": "H", "config": {"lr": NaN}}', id="config-nan"),
        pytest.param('{"handoff": "H", "config_identity": 5}', id="identity-int"),
        pytest.param('{"handoff": "H", "config_identity": "ABC"}', id="identity-not-hex"),
        pytest.param('{"handoff": "H", "config": ' + "[" * 5000 + "]" * 5000 + "}", id="deep"),
    ],
)
def test_handoff_edited_by_hand_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "handoff.json"
    path.write_text(text.replace('"H"', json.dumps(HANDOFF_FORMAT)), "utf-8")
    with pytest.raises(ConfigError) as info:
        restorepoint.load_expectations(path)
    assert info.value.exit_code == 2
    assert info.value.url == str(path)
    assert "\n" not in str(info.value)


def test_handoff_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "handoff.json"
    path.write_bytes(b'{"handoff": "\xff"}')
    with pytest.raises(ConfigError):
        restorepoint.load_expectations(path)


def test_handoff_missing_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as info:
        restorepoint.load_expectations(tmp_path / "nowhere.json")
    assert info.value.exit_code == 4


# -- integrity first, head only, nothing written ----------------------------------------------


def test_integrity_error_is_raised_not_a_refusal(
    tmp_path: Path, rp: tuple[str, restorepoint.Manifest]
) -> None:
    url, _ = rp
    data = bytearray(Path(url).read_bytes())
    data[40] ^= 0x01  # inside the head: the head digest no longer matches
    broken = tmp_path / "broken.rpt"
    broken.write_bytes(bytes(data))
    wrong = Expectations(cache_root="/elsewhere")
    for expect in (everything(), wrong):
        with pytest.raises(IntegrityError) as info:
            restorepoint.check(str(broken), expect)
        assert isinstance(info.value, DigestMismatch)
        assert not isinstance(info.value, IncompatibleRestorePoint)
        assert info.value.url == str(broken)
    other = tmp_path / "not.rpt"
    other.write_bytes(b"PK\x03\x04 a zip file, not a restore point" * 10)
    with pytest.raises(NotARestorePoint):
        restorepoint.check(str(other), wrong)


def test_gate_decides_from_the_head_alone(
    tmp_path: Path, rp: tuple[str, restorepoint.Manifest]
) -> None:
    # The index and payload are not read: damage there is for verify and import to find.
    data = Path(rp[0]).read_bytes()
    cut = tmp_path / "cut.rpt"
    cut.write_bytes(data[: len(data) // 2])
    assert restorepoint.check(str(cut), everything()).compatible
    assert [m["field"] for m in refused(str(cut), Expectations(cache_root="/x"))] == ["cache_root"]
    with pytest.raises(IntegrityError):
        restorepoint.verify(str(cut))


def test_check_writes_nothing(tmp_path: Path, rp: tuple[str, restorepoint.Manifest]) -> None:
    url, manifest = rp
    handoff = tmp_path / "handoff.json"
    restorepoint.write_handoff(handoff, restorepoint.handoff_document(manifest, url))
    before = snapshot(tmp_path)
    restorepoint.check(url, restorepoint.load_expectations(handoff))
    refused(url, Expectations(terms={}, cache_root=None, config={"lr": 1}))
    restorepoint.check(url, Expectations(trainer=None), raise_on_mismatch=False)
    assert snapshot(tmp_path) == before
