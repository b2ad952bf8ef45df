"""Reusable test support that ships with restorepoint: a forge for restore points with planted
faults, and (in later modules) conformance suites for stores and adapters."""

from __future__ import annotations

from .forge import ForgedEntry, Parts, assemble, sample_head

__all__ = ["ForgedEntry", "Parts", "assemble", "sample_head"]
