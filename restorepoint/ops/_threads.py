"""The thread pool's default size, shared by the writer (pack) and the readers (verify, import,
materialize): in a module of its own so that a reader does not load pack's modules for it."""

from __future__ import annotations

import os

__all__ = ["default_threads"]


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))
