"""``dygserve bench gpu`` on tiny sizes: it runs on a CPU-only machine (the CUDA rows say
they were not run), rewrites only its own section of the report, and its rank-major
packing of equal-length nodes is the plan's. Figures are never asserted."""

from __future__ import annotations

import torch

from loadtests.bench import main as bench_main
from loadtests.gpu_bench import (
    PATHS,
    SECTION_END,
    SECTION_START,
    ColdRow,
    _rank_major,
    extract_section,
    render,
    replace_section,
    synthetic_events,
)
from model.events import NodeEvent, pack_events
from model.rank_plan import RankPlan


def test_section_helpers():
    doc = f"# Benchmarks\n\nintro\n\n{SECTION_START}\nold\n{SECTION_END}\n\n## Goals\n"
    new = f"{SECTION_START}\nnew\n{SECTION_END}"
    out = replace_section(doc, new)
    assert extract_section(out) == new and "intro" in out and out.endswith("## Goals\n")
    assert extract_section("no section") is None
    assert extract_section(replace_section("# B\n", new)) == new


def test_rank_major_packing_is_the_plans():
    ev = synthetic_events(5, 4, 2, gaps=torch.rand(50).double().numpy())
    plan = RankPlan.build([4] * 5)
    per_node = [
        [
            NodeEvent(
                int(ev.other_key[i, k]),
                int(ev.role[i, k]),
                ev.features[i, k].tolist(),
                float(ev.t[i, k]),
                int(ev.seq[i, k]),
            )
            for k in range(4)
        ]
        for i in range(5)
    ]
    packed = pack_events(per_node, plan, 2)
    mine = _rank_major(ev)
    assert torch.equal(mine.t, packed.t) and torch.equal(mine.other_key, packed.other_key)
    assert torch.equal(mine.features, packed.features)


def test_bench_gpu_writes_its_section_only(tmp_path, data_dir):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# Benchmarks\n\nkept\n\n{SECTION_START}\nnot run\n{SECTION_END}\n\ntail\n")
    args = ["gpu", "--doc", str(doc), "--data", str(data_dir), "--nodes", "8", "--lengths", "4"]
    args += ["--backfill", "uci", "--backfill-limit", "300", "--score-pairs", "32"]
    assert bench_main([*args, "--score-repeats", "1"]) == 0
    text = doc.read_text()
    section = extract_section(text)
    assert section is not None and "not run\n" not in section
    assert text.startswith("# Benchmarks\n\nkept\n") and text.rstrip().endswith("tail")
    assert "| 8 | 4 |" in section and "| uci | 600 |" in section
    if not torch.cuda.is_available():
        assert "no CUDA device" in section and "not run (no CUDA provider)" in section


def test_a_failed_path_is_reported_with_its_reason_beside_the_others_figures():
    secs = {"torch-cpu": 2.0, "torch-cuda": 0.5, "mamba-ssm": None}
    row = ColdRow(100, 16, secs, dict.fromkeys(PATHS, False), None, {"mamba-ssm": "OOM: 9 GiB"})
    text = render([row], None, [], None, 1e9, "bench gpu", "failed: KeyError: 'x'")
    assert "| 100 | 16 | 2 s | 0.5 s | failed |" in text
    assert "mamba-ssm failed at 100 x 16: OOM: 9 GiB" in text
    assert "failed: KeyError: 'x'" in text  # the backfill's failure, in its section
