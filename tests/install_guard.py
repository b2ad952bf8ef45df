"""Refuse an install that would bring a CUDA build: tests/run runs this on pip's dry-run report.

    python tests/install_guard.py REPORT.json

Exit 0 when nothing CUDA-only is about to be installed; otherwise one line on stderr naming what
would be, and exit 1, before a byte of it is downloaded. The test environment is the CPU build of
torch (constraints/torch.txt); a CUDA build is several GB of wheels and turns a fresh machine's
test run from minutes into most of an hour.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: Distributions that only a CUDA build of torch pulls in.
CUDA_ONLY = re.compile(r"^(nvidia-.*|cuda-.*|triton)$")
#: A local version label of a CUDA or ROCm build (torch 2.13.0+cu130).
CUDA_BUILD = re.compile(r"\+(cu|rocm)\d")


def cuda_items(report: dict[str, object]) -> list[str]:
    """What of pip's installation report is CUDA-only, as "name version"."""
    found = []
    install = report.get("install")
    for item in install if isinstance(install, list) else []:
        meta = item.get("metadata", {}) if isinstance(item, dict) else {}
        name = str(meta.get("name", "")).lower().replace("_", "-")
        version = str(meta.get("version", ""))
        if CUDA_ONLY.match(name) or (name == "torch" and CUDA_BUILD.search(version)):
            found.append(f"{name} {version}")
    return sorted(found)


def torch_version(report: dict[str, object]) -> str | None:
    install = report.get("install")
    for item in install if isinstance(install, list) else []:
        meta = item.get("metadata", {}) if isinstance(item, dict) else {}
        if str(meta.get("name", "")).lower() == "torch":
            return str(meta.get("version", ""))
    return None


def refusal(report: dict[str, object]) -> str | None:
    """The one line tests/run prints before it refuses, or None when the install is CPU only."""
    found = cuda_items(report)
    if not found:
        return None
    torch = torch_version(report)
    what = f"torch {torch}, which pulls " if torch else ""
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return (
        f"tests/run: refusing to install a CUDA build ({what}{', '.join(found[:3])}{more}): "
        "install the CPU wheel of torch first (pip install torch==2.13.0 where it lies on "
        "disk, or from PyTorch's CPU index)"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/install_guard.py REPORT.json", file=sys.stderr)
        return 2
    line = refusal(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    if line is not None:
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
