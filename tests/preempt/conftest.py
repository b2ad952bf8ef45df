"""Fixtures of the preemption tests: the metadata-service emulators (emulators.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .emulators import AwsEmulator, GcpEmulator


@pytest.fixture
def aws() -> Iterator[AwsEmulator]:
    with AwsEmulator() as emu:
        yield emu


@pytest.fixture
def gcp() -> Iterator[GcpEmulator]:
    with GcpEmulator() as emu:
        yield emu
