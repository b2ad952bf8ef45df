"""Config identity: known hash values, operational keys, and diff_configs."""

from __future__ import annotations

import hashlib

import pytest

from restorepoint.format import (
    CanonicalizationError,
    ConfigDifference,
    canonical_dumps,
    config_identity,
    diff_configs,
    identity_view,
)
from restorepoint.format.identity import check_operational_key

# (config, operational keys, the canonical bytes of the identity view written out by hand,
# sha256 of those bytes computed once and pinned)
KNOWN = [
    ({}, [], b"{}", "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"),
    (
        {"b": 1, "a": [1.5, "x", None, True, False]},
        [],
        b'{"a":[1.5,"x",null,true,false],"b":1}',
        "873a2ba5b454ae61a9d4a27602e8314cf97a2eaac175df5cbde2e0821e438802",
    ),
    (
        {"lr": 0.001, "model": {"width": 64}, "train": {"checkpoint_every": 500}},
        ["train.checkpoint_every"],
        b'{"lr":0.001,"model":{"width":64}}',
        "a2e6544a0b6467a83ae00965d69943764db836b22942e4a4254a8a36e2fbab56",
    ),
    (
        # RFC 8785 sorts keys by UTF-16 code units: the emoji (D83D ...) before U+FF01
        {"\U0001f600": 1, "\uff01": 2, "a": 3},
        [],
        b'{"a":3,"\xf0\x9f\x98\x80":1,"\xef\xbc\x81":2}',
        "820c65d192ed794d75cd7a01b132dcfba887c88a42d42b2e7c5e4d875192664d",
    ),
    (
        {"big": 1e21, "small": 1e-7, "int_float": 2.0, "neg_zero": -0.0, "third": 1 / 3},
        [],
        b'{"big":1e+21,"int_float":2,"neg_zero":0,"small":1e-7,"third":0.3333333333333333}',
        "6706f6b4aee8f2e75bde848a30d85ab1bf1b3f0e7dae417de8fc2a7c05a976db",
    ),
    (
        {"s": 'é\n"\\\u0007'},
        [],
        b'{"s":"\xc3\xa9\\n\\"\\\\\\u0007"}',
        "46f00cb9afa1546890afa6c8317e2491020b64a33e77b111d6c596da15e9ce50",
    ),
]


@pytest.mark.parametrize(("config", "operational", "canonical", "digest"), KNOWN)
def test_known_identities(
    config: dict[str, object], operational: list[str], canonical: bytes, digest: str
) -> None:
    assert hashlib.sha256(canonical).hexdigest() == digest
    assert canonical_dumps(identity_view(config, operational)) == canonical
    assert config_identity(config, operational) == digest


def test_operational_keys_remove_and_prune() -> None:
    config = {
        "lr": 0.1,
        "train": {"checkpoint_every": 500, "steps": 1000},
        "log": {"every": 10, "wandb": {"project": "x"}},
        "slurm": {"resubmit": {"max": 3}},
    }
    operational = ["train.checkpoint_every", "log.every", "log.wandb", "slurm.resubmit.max"]
    view = identity_view(config, operational)
    assert view == {"lr": 0.1, "train": {"steps": 1000}}
    # the config itself is untouched
    assert config["log"] == {"every": 10, "wandb": {"project": "x"}}
    assert config_identity(config, operational) == config_identity(view)


def test_an_empty_section_on_an_operational_path_is_pruned_too() -> None:
    # {"log": {}} and {"log": {"every": 10}} are the same training when log.every is
    # operational: adding the value must not move the identity
    ops = ["log.every"]
    assert identity_view({"lr": 1, "log": {}}, ops) == {"lr": 1}
    assert config_identity({"lr": 1, "log": {}}, ops) == config_identity({"lr": 1}, ops)
    assert config_identity({"lr": 1, "log": {"every": 10}}, ops) == config_identity({"lr": 1}, ops)
    # an empty mapping that no operational key reaches stays part of the identity
    assert config_identity({"lr": 1, "model": {}}, ops) != config_identity({"lr": 1}, ops)


def test_operational_keys_that_match_nothing() -> None:
    config = {"a": 1, "b": [{"c": 1}], "d": "text"}
    ops = ["x", "a.b", "b.c", "d.e", "b.0"]
    assert identity_view(config, ops) == config
    assert config_identity(config, ops) == config_identity(config)


def test_an_operational_key_may_name_a_whole_section() -> None:
    assert identity_view({"a": 1, "log": {"x": 1, "y": {"z": 2}}}, ["log"]) == {"a": 1}


def test_dotted_config_keys_are_not_paths() -> None:
    # "a.b" as one key is not the path a -> b
    assert identity_view({"a.b": 1, "a": {"b": 2}}, ["a.b"]) == {"a.b": 1}


@pytest.mark.parametrize("key", ["", ".", "a.", ".a", "a..b"])
def test_bad_operational_keys(key: str) -> None:
    with pytest.raises(ValueError, match="operational key"):
        check_operational_key(key)
    with pytest.raises(ValueError, match="operational key"):
        config_identity({"a": 1}, [key])


@pytest.mark.parametrize(
    "config",
    [{"x": float("nan")}, {"x": float("inf")}, {"x": 2**53}, {"x": -(2**53)}, {"x": {1, 2}}],
)
def test_configs_json_cannot_represent(config: dict[str, object]) -> None:
    with pytest.raises(CanonicalizationError):
        config_identity(config)
    assert issubclass(CanonicalizationError, ValueError)


def test_identity_is_lowercase_hex() -> None:
    identity = config_identity({"a": 1})
    assert len(identity) == 64
    assert identity == identity.lower()
    int(identity, 16)


# -- diff_configs -----------------------------------------------------------------------------


def test_diff_lists_exactly_the_changed_leaves() -> None:
    expected = {
        "lr": 0.1,
        "model": {"width": 64, "depth": 2, "act": "gelu"},
        "train": {"checkpoint_every": 500, "steps": 100},
        "same": [1, 2, 3],
    }
    found = {
        "lr": 0.2,
        "model": {"width": 64, "act": "relu", "norm": "rms"},
        "train": {"checkpoint_every": 9, "steps": 100},
        "same": [1, 2, 3],
        "extra": None,
    }
    diffs = diff_configs(expected, found, ["train.checkpoint_every"])
    assert diffs == [
        ConfigDifference("extra", None, None, expected_present=False, found_present=True),
        ConfigDifference("lr", 0.1, 0.2),
        ConfigDifference("model.act", "gelu", "relu"),
        ConfigDifference("model.depth", 2, None, expected_present=True, found_present=False),
        ConfigDifference("model.norm", None, "rms", expected_present=False, found_present=True),
    ]
    assert [d.describe() for d in diffs] == [
        "extra: expected (absent), found null",
        "lr: expected 0.1, found 0.2",
        'model.act: expected "gelu", found "relu"',
        "model.depth: expected 2, found (absent)",
        'model.norm: expected (absent), found "rms"',
    ]


def test_diff_of_equal_identities_is_empty() -> None:
    a = {"lr": 1.0, "train": {"every": 1}, "z": [1, {"b": 2}]}
    b = {"z": [1, {"b": 2}], "lr": 1, "train": {"every": 99}}
    assert diff_configs(a, b, ["train.every"]) == []
    assert config_identity(a, ["train.every"]) == config_identity(b, ["train.every"])


def test_diff_where_a_mapping_meets_a_value() -> None:
    diffs = diff_configs({"a": {"b": 1}, "l": [1, 2]}, {"a": 2, "l": [1, 3]})
    assert diffs == [ConfigDifference("a", {"b": 1}, 2), ConfigDifference("l", [1, 2], [1, 3])]
    assert diffs[0].describe() == 'a: expected {"b":1}, found 2'


def test_diff_of_a_section_present_on_one_side() -> None:
    (diff,) = diff_configs({"opt": {"name": "adam", "beta": 0.9}}, {})
    assert diff == ConfigDifference(
        "opt", {"beta": 0.9, "name": "adam"}, None, expected_present=True, found_present=False
    )
    assert diff.describe() == 'opt: expected {"beta":0.9,"name":"adam"}, found (absent)'


def test_diff_ignores_operational_sections_on_either_side() -> None:
    assert diff_configs({"a": 1, "log": {"every": 1}}, {"a": 1}, ["log.every"]) == []
    assert diff_configs({"a": 1}, {"a": 1, "log": {}}, ["log.every"]) == []


def test_diff_and_identity_agree() -> None:
    pairs = [
        ({"a": 1}, {"a": 1.0}),
        ({"a": -0.0}, {"a": 0}),
        ({"a": 1}, {"a": True}),
        ({"a": None}, {}),
        ({"a": "1"}, {"a": 1}),
    ]
    for left, right in pairs:
        same_identity = config_identity(left) == config_identity(right)
        assert (diff_configs(left, right) == []) is same_identity, (left, right)
