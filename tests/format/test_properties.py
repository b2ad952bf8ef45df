"""Properties: any valid manifest survives the format unchanged, and the config identity moves
exactly when what is trained moves."""

from __future__ import annotations

import copy
import hashlib
import random
import secrets
from typing import Any

import fsspec
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import restorepoint
from restorepoint.format import canonical_dumps, check_paths, config_identity, identity_view
from restorepoint.format.limits import MAX_SAFE_INTEGER
from restorepoint.testing import ForgedEntry, Parts, assemble, sample_head

SETTINGS = settings(max_examples=60, deadline=None)

# -- strategies -------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=15,
)
configs = st.dictionaries(st.text(max_size=8), json_values, max_size=6)

# Dotted paths address nested mappings; these keys contain no dot and are never empty.
segments = st.text(alphabet="abcdeèxyz_", min_size=1, max_size=3)
plain_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(segments, inner, max_size=3),
    max_leaves=10,
)
dotted_configs = st.dictionaries(segments, plain_values, max_size=5)
dotted_keys = st.lists(segments, min_size=1, max_size=3).map(".".join)

names = st.text(min_size=1, max_size=10)
short_maps = st.dictionaries(names, st.text(max_size=10), max_size=4)


@st.composite
def positions(draw: st.DrawFn) -> dict[str, int]:
    out = {"step": draw(st.integers(0, MAX_SAFE_INTEGER))}
    if draw(st.booleans()):
        out["epoch"] = draw(st.integers(0, MAX_SAFE_INTEGER))
        if draw(st.booleans()):
            out["batch"] = draw(st.integers(0, MAX_SAFE_INTEGER))
    return out


@st.composite
def heads(draw: st.DrawFn) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "id": secrets.token_hex(16),
        "position": draw(positions()),
        "terms": draw(short_maps),
        "cache_keys": draw(short_maps),
        "cache_root": draw(st.none() | st.text(max_size=20)),
        "run": draw(st.none() | st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")),
        "trainer": draw(
            st.none() | st.builds(lambda n, v: {"name": n, "version": v}, names, st.text())
        ),
        "created": draw(
            st.sampled_from(["2026-01-01T00:00:00Z", "1999-12-31T23:59:59.123456789Z"])
        ),
    }
    if draw(st.booleans()):
        config = draw(configs)
        operational = sorted(set(draw(st.lists(dotted_keys, max_size=4))))
        overrides.update(
            config=config,
            operational_keys=operational,
            config_identity=config_identity(config, operational),
        )
    else:
        overrides.update(config=None, config_identity=None, operational_keys=[])
    return sample_head(**overrides)


file_paths = st.builds(
    lambda prefix, name: f"{prefix}{name}.bin",
    st.sampled_from(["", "opt/", "opt/deep/", "é文/"]),
    st.text(alphabet="abc0é文", min_size=1, max_size=4),
)
payloads = st.dictionaries(file_paths, st.binary(max_size=300), max_size=5)


# -- manifest round trip ----------------------------------------------------------------------


@SETTINGS
@given(head=heads(), files=payloads, codec=st.sampled_from([None, {"level": 1, "name": "zstd"}]))
def test_manifest_round_trip(head: dict[str, Any], files: dict[str, bytes], codec: Any) -> None:
    check_paths(sorted(files, key=str.encode))
    entries = [
        ForgedEntry.from_bytes(p, files[p], codec=codec) for p in sorted(files, key=str.encode)
    ]
    parts = Parts(head=head, entries=entries)
    data = assemble(parts)
    head_bytes = canonical_dumps(head)
    data_start = 16 + len(head_bytes) + 32
    expected = dict(head)
    expected["payload"] = parts.index_document(hashlib.sha256(head_bytes).hexdigest(), data_start)[
        "payload"
    ]

    fs = fsspec.filesystem("memory")
    path = f"/rp-properties/{secrets.token_hex(8)}.rpt"
    fs.pipe_file(path, data)
    try:
        url = f"memory://{path}"
        report = restorepoint.verify(url, threads=1)
        assert report.manifest.to_dict() == expected
        assert report.files == len(files)
        assert report.bytes == sum(len(v) for v in files.values())
        assert restorepoint.read_manifest(url).to_dict() == expected
        head_only = restorepoint.read_manifest(url, head_only=True).to_dict()
        assert head_only == {k: v for k, v in expected.items() if k != "payload"}
    finally:
        fs.rm(path)


# -- identity ---------------------------------------------------------------------------------


def dict_paths(config: dict[str, Any], prefix: str = "") -> list[str]:
    """Every dotted path to a value in nested mappings (lists are leaves)."""
    out = []
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else key
        out.append(path)
        if isinstance(value, dict):
            out.extend(dict_paths(value, path))
    return out


def leaf_paths(config: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.extend(leaf_paths(value, path))
        else:
            out.append(path)
    return out


def assign(config: dict[str, Any], path: str, value: Any) -> dict[str, Any] | None:
    """A copy with ``value`` at ``path``, creating mappings on the way; None where a value
    that is not a mapping stands on the way."""
    out = copy.deepcopy(config)
    node = out
    *parents, last = path.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            return None
        node = child
    node[last] = value
    return out


def remove(config: dict[str, Any], path: str) -> dict[str, Any]:
    out = copy.deepcopy(config)
    node: Any = out
    *parents, last = path.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)
    return out


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def is_under(path: str, key: str) -> bool:
    return path == key or path.startswith(key + ".")


@SETTINGS
@given(config=dotted_configs, others=st.lists(dotted_keys, max_size=3), data=st.data())
def test_operational_values_never_move_the_identity(
    config: dict[str, Any], others: list[str], data: st.DataObject
) -> None:
    existing = dict_paths(config)
    key = data.draw(
        (st.sampled_from(existing) | dotted_keys) if existing else dotted_keys, label="key"
    )
    operational = sorted({key, *others})
    before = config_identity(config, operational)
    original = copy.deepcopy(config)

    changed = assign(config, key, data.draw(plain_values, label="value"))
    assume(changed is not None)
    assert changed is not None
    assert config_identity(changed, operational) == before
    assert config_identity(remove(config, key), operational) == before
    assert config_identity(remove(changed, key), operational) == before
    assert config == original  # the config itself is never changed


@SETTINGS
@given(config=dotted_configs, operational=st.lists(dotted_keys, max_size=3), data=st.data())
def test_other_leaf_values_always_move_the_identity(
    config: dict[str, Any], operational: list[str], data: st.DataObject
) -> None:
    leaves = [p for p in leaf_paths(config) if not any(is_under(p, k) for k in operational)]
    assume(leaves)
    path = data.draw(st.sampled_from(leaves), label="path")
    new = data.draw(json_scalars | st.lists(json_scalars, max_size=3), label="value")
    node: Any = config
    for part in path.split("."):
        node = node[part]
    assume(canonical_dumps(new) != canonical_dumps(node))
    changed = assign(config, path, new)
    assert changed is not None
    assert config_identity(changed, operational) != config_identity(config, operational)
    # and removing it moves the identity too
    assert config_identity(remove(config, path), operational) != config_identity(
        config, operational
    )


@SETTINGS
@given(
    config=configs,
    operational=st.lists(dotted_keys, max_size=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_identity_ignores_key_order(
    config: dict[str, Any], operational: list[str], seed: int
) -> None:
    rng = random.Random(seed)
    reordered = shuffled(config, rng)
    keys = list(operational)
    rng.shuffle(keys)
    assert config_identity(reordered, keys) == config_identity(config, operational)
    assert canonical_dumps(identity_view(reordered, keys)) == canonical_dumps(
        identity_view(config, operational)
    )


@SETTINGS
@given(
    config=dotted_configs,
    section=st.lists(segments, min_size=1, max_size=3),
    settings_=st.dictionaries(segments, plain_values, min_size=1, max_size=3),
)
def test_identity_view_removes_mappings_left_empty(
    config: dict[str, Any], section: list[str], settings_: dict[str, Any]
) -> None:
    assume(section[0] not in config)
    with_section = assign(config, ".".join(section), settings_)
    assert with_section is not None
    operational = [".".join([*section, key]) for key in settings_]
    view = identity_view(with_section, operational)
    assert section[0] not in view
    assert view == identity_view(config, operational)
    assert config_identity(with_section, operational) == config_identity(config, operational)
    # a mapping that keeps a non-operational setting stays, with only that setting
    kept = assign(with_section, ".".join([*section, "zz_kept"]), 1)
    assume("zz_kept" not in settings_)
    assert kept is not None
    node: Any = identity_view(kept, operational)
    for part in section:
        node = node[part]
    assert node == {"zz_kept": 1}


@SETTINGS
@given(config=configs)
def test_identity_is_the_sha256_of_the_canonical_config(config: dict[str, Any]) -> None:
    assert config_identity(config) == hashlib.sha256(canonical_dumps(config)).hexdigest()
    assert identity_view(config, []) == config
