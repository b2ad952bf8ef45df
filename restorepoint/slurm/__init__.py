"""The Slurm contract: an sbatch script that turns the time-limit warning and preemption into a
snapshot, exit 42 and a bounded requeue (docs/slurm.md)."""

from __future__ import annotations

from .template import render

__all__ = ["render"]
