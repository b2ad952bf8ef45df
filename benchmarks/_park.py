"""The benchmark's state moved to disk while a resume process runs, for sizes where this machine
cannot hold the benchmark's state and a resumed one at once (bench_resume.py ``--park``).

A resume needs the state's bytes free, as it would on the empty machine a preempted job restarts
on; the benchmark's own process holds its copy of the state for the next tool's save. Parked, the
model's parameters and Adam's moments are written once to a file in the work directory and their
memory is freed; unparked, they are read back into fresh memory (the same parameter objects, so
the optimizer and every tool see the same model) and the file's pages are dropped from the page
cache, so that the next tool's save does not pay for reclaiming them. Neither is timed.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any


class Parking:
    """Park and unpark one model and its optimizer's state (tensors only: Adam's step count is a
    tensor too)."""

    def __init__(self, model: Any, optimizer: Any, path: Path) -> None:
        self.model, self.optimizer, self.path = model, optimizer, path
        self.params = list(model.parameters())
        self.parked = False

    def park(self) -> None:
        import torch

        from restorepoint._posix import fsync_file

        if not self.path.exists():  # the state never changes between cycles: written once
            partial = self.path.with_suffix(".partial")
            saved = {
                "params": [p.data for p in self.params],
                "state": [dict(self.optimizer.state[p]) for p in self.params],
            }
            torch.save(saved, partial)
            fsync_file(partial)  # written back: its pages can then be dropped, not only reclaimed
            os.replace(partial, self.path)
            del saved
            self._drop_cache()
        self.parked = True  # from here on, unpark() puts back whatever was freed
        for p in self.params:
            p.data = torch.empty(0, dtype=p.dtype)
        for p in self.params:
            state = self.optimizer.state[p]
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = torch.empty(0, dtype=value.dtype)
        gc.collect()

    def unpark(self) -> None:
        import torch

        if not self.parked:
            return
        saved = torch.load(self.path, mmap=True, weights_only=True)
        for p, data in zip(self.params, saved["params"], strict=True):
            p.data = data.clone()
        for p, state in zip(self.params, saved["state"], strict=True):
            self.optimizer.state[p] = {k: v.clone() for k, v in state.items()}
        del saved
        gc.collect()
        self._drop_cache()
        self.parked = False

    def _drop_cache(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
