"""``dygserve bench pipeline`` on a small slice of UCI against the suite's Redis: it
reports every figure (nothing about their size is asserted: speed is for the bench,
not the tests) and leaves nothing of its repetitions in the caller's Redis."""

from __future__ import annotations

import re

import redis

from loadtests.bench import INGEST_REPS, SCORING_REPS, bench_pipeline
from service.settings import DEFAULT_CHECKPOINT


def test_bench_pipeline_reports_medians_and_cleans_up(redis_single, data_dir) -> None:
    client = redis.Redis.from_url(redis_single.url)
    client.set("someone-elses-key", b"kept")
    text = bench_pipeline(
        DEFAULT_CHECKPOINT, data_dir / "uci" / "edges.csv.gz", redis_single.url, 1500, 8
    )

    def figure(label: str) -> float:
        match = re.search(rf"\| {re.escape(label)}[^|]*\| ([\d,.]+)", text)
        assert match, f"no row {label!r} in:\n{text}"
        return float(match.group(1).replace(",", ""))

    assert f"median of {INGEST_REPS} runs" in text and f"median of {SCORING_REPS} runs" in text
    for label in (
        "ingest, batches of 1,000 events",
        "batch scoring from cached states",
        "recompute variant",
        "cached / recompute",
    ):
        assert figure(label) > 0
    assert len(re.findall(r"runs [\d,]+ to [\d,]+", text)) == 2
    # Only the bench's own keys are gone: the repetitions wrote under prefixes of their own.
    assert [k for k in client.scan_iter(match="dygserve-bench-*")] == []
    assert client.get("someone-elses-key") == b"kept"
    client.delete("someone-elses-key")
