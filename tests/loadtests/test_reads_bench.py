"""``dygserve bench reads`` on a small slice of UCI, with the ingest on a second service
process (``--ingest-replica``) and the writer's scripts in slices: every row of the
report is there, no request failed, and the events went to the ingest replica only.
Nothing about the latencies is asserted (speed is for the bench, not the tests)."""

from __future__ import annotations

import re

import pytest

from loadtests.reads_bench import bench_reads
from service.settings import DEFAULT_CHECKPOINT
from tests.support.redis_server import redis_available


@pytest.mark.skipif(not redis_available(), reason="redis-server not installed (CI installs it)")
def test_reads_beside_writes_on_an_ingest_replica(data_dir, tmp_path) -> None:
    rows = bench_reads(
        DEFAULT_CHECKPOINT,
        data_dir / "uci" / "edges.csv.gz",
        tmp_path,
        reps=1,
        seconds=2.0,
        warm_events=500,
        extra_env={"DYGSERVE_STORE__SCRIPT_SLICE": "10"},
        ingest_replica=True,
    )
    text = "\n".join(rows)
    latencies = re.findall(r"p99 ([\d.]+) ms", text)
    assert len(latencies) == 2 and text.count("(0 errors)") == 2, text
    (logged,) = [r for r in rows if r.startswith("| events logged")]
    reads, writes = (float(x.replace(",", "")) for x in logged.split("|")[2].split("/"))
    assert reads == 0 and writes >= 500, logged  # the warm-up and the ingest beside
