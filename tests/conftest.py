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


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "uci" / "edges.csv.gz").exists():
        pytest.fail(f"real datasets not found at {DATA} (set DYGSERVE_DATA)")
    return DATA


# Shared test helpers live in the `tests.support` package (real Redis servers, store
# workers that multiprocessing 'spawn' children import by name): the repo root must
# be importable however pytest was started.
import sys  # noqa: E402

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
