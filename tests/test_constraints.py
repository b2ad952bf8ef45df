"""constraints/test.txt is the test environment: it pins every dependency the project names, at a
version its own range admits, and nothing CUDA-only (a CUDA build of torch is several GB)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tests run on 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;]+)")


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line)
        if match:
            found[canonicalize_name(match[1])] = match[2]
    return found


def requirements() -> list[Requirement]:
    """The project's dependencies and those of the extras tests/run installs (all, test)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    found = [Requirement(r) for r in project["dependencies"]]
    todo, seen = ["all", "test"], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in extras[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "restorepoint":
                todo += sorted(req.extras)
            else:
                found.append(req)
    env = default_environment()
    return [r for r in found if r.marker is None or r.marker.evaluate(env)]


def test_every_dependency_is_pinned_within_its_range() -> None:
    pinned = pins(ROOT / "constraints" / "test.txt")
    stale = []
    for req in requirements():
        version = pinned.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            stale.append(f"{req} (pinned: {version})")
    assert not stale, f"run constraints/compile: {stale}"


def test_nothing_cuda_only_is_pinned_and_torch_is_the_cpu_release() -> None:
    pinned = pins(ROOT / "constraints" / "test.txt")
    assert not [n for n in pinned if re.match(r"nvidia-|cuda-|triton$", n)]
    assert pinned["torch"] == pins(ROOT / "constraints" / "torch.txt")["torch"] == "2.13.0"
    assert "pip==" in (ROOT / "tests" / "run").read_text(encoding="utf-8")
