"""Suite-wide settings: one torch thread (CI has 2 cores shared by servers and tests),
and the location of the shared real datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DYGSERVE_DATA", REPO.parent / "shared" / "data"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` need CUDA: skipped, with the reason, where torch sees none
    (their CPU counterparts run everywhere; docs/BENCHMARKS.md lists what to run on a GPU)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="needs CUDA: torch sees no GPU here (CPU build or no device); run on a GPU machine"
    )
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "uci" / "edges.csv.gz").exists():
        pytest.fail(f"real datasets not found at {DATA} (set DYGSERVE_DATA)")
    return DATA


# Store fixtures (real redis-server processes per session, a backend per test) for
# every test package that runs on each store backend.
pytest_plugins = ["tests.support.store_fixtures"]
