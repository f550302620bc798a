"""The platform store these modules' tests write to: a fresh SQLite database each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelinerl.platform.tracking.store import PlatformStore


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'platform.db'}"


@pytest.fixture
def store(url: str) -> Iterator[PlatformStore]:
    with PlatformStore(url) as store:
        yield store
