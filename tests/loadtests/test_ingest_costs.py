"""The ingest-costs stage table runs both modes and times each where it runs (one
repetition on the bundled checkpoint and real UCI events: a smoke test, not a
benchmark; the figures themselves are docs/BENCHMARKS.md's)."""

from __future__ import annotations

import torch

from loadtests.ingest_costs import REQUEST, SEND, WAIT, stage_rows
from service.engine import ModelRuntime
from service.settings import DEFAULT_CHECKPOINT


def cells(rows: list[str], label: str) -> list[str]:
    (row,) = [r for r in rows if r.startswith(f"| {label} |")]
    return [c.strip() for c in row.strip("|").split("|")][1:]


def test_stage_table_times_each_mode_where_it_runs(redis_single, data_dir) -> None:
    torch.set_num_threads(1)
    rows = stage_rows(
        ModelRuntime.load(DEFAULT_CHECKPOINT), redis_single.url, data_dir / "uci", reps=1
    )
    plain_append, overlapped_append = cells(rows, "log: append (arguments, script, answers)")
    assert float(plain_append) > 0 and overlapped_append == "–"  # overlapped: sent, then waited for
    for label in (SEND, WAIT):
        plain, overlapped = cells(rows, label)
        assert plain == "–" and float(overlapped) >= 0
    assert float(cells(rows, SEND)[1]) > 0
    for mode_total, mode_request in zip(cells(rows, "total"), cells(rows, REQUEST), strict=True):
        assert float(mode_total) > float(mode_request) > 0
    assert all("events/s" in c for c in cells(rows, "in-process ingest rate, parse to applied"))
