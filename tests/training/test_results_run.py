"""``training.results`` end to end on a small snapshot stream: the default command's
choices reach every row (the trainer's batch visibility, and the evaluator replaying
with it for the full model and for each further seed)."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np

from training.machine import cpu_name
from training.results import main
from training.train import TRAIN_STATE_DIR, train


def test_results_rows_replay_with_the_visibility_each_seed_was_trained_with(
    data_dir, tmp_path
) -> None:
    # Every 12th US Legis. event: twelve congresses of about 420 events each, so every
    # timestamp group is longer than a training batch (a snapshot stream).
    with gzip.open(data_dir / "uslegis" / "edges.csv.gz", "rt") as f:
        header, *rows = f.read().splitlines()
    root = tmp_path / "data"
    (root / "snap").mkdir(parents=True)
    with gzip.open(root / "snap" / "edges.csv.gz", "wt") as f:
        f.write("\n".join([header, *rows[::12]]) + "\n")
    out, doc = tmp_path / "runs", tmp_path / "RESULTS.md"

    def run(*extra: str, baselines: bool = False) -> int:
        return main(
            ["--data", str(root), "--out", str(out), "--doc", str(doc), "--datasets", "snap"]
            + ["--epochs", "1", "--no-ablation", "--mrr-k", "0", *extra]
            + ([] if baselines else ["--no-baselines"])
        )

    assert run("--seeds", "0,1") == 0
    summary = json.loads((out / "snap" / "summary.json").read_text())
    # A copy is kept beside the document, for a later session's render.
    kept = tmp_path / "results" / "summaries" / "snap.json"
    assert json.loads(kept.read_text()) == summary
    full = summary["variants"]["full"]
    assert full["train"]["visibility"] == "batch"
    assert any("batch visibility" in r for r in full["train"]["auto"]["reasons"])
    assert full["eval"]["visibility"] == "batch"
    assert (
        json.loads((out / "snap" / "full-seed1" / "metrics.json").read_text())["visibility"]
        == "batch"
    )
    seeds = full["seeds"]
    assert sorted(seeds) == ["0", "1"]
    assert all(0.0 < seeds[s]["random"] <= 1.0 for s in seeds)
    assert summary["seed_stats"]["random"]["n"] == 2
    assert np.isfinite(summary["seed_stats"]["random"]["std"])
    # The row's budget column says how it was evaluated.
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| snap | rnd |")]
    assert rows and all("batch visibility" in line for line in rows)

    # A later session, runs/ gone: --reuse starts from the kept summary and adds a seed
    # without training the rows it already has.
    shutil.rmtree(out)
    # Seed 2 trained beside it (`dygserve train --out`, the run's settings): --reuse
    # resumes its finished state, so it is evaluated without training it again.
    seed2 = out / "snap" / "full-seed2"
    train(
        root / "snap" / "edges.csv.gz", seed2, {}, epochs=1, progress=False, test_eval=False, seed=2
    )
    state = seed2 / TRAIN_STATE_DIR / "state.json"
    trained_at = state.stat().st_mtime_ns
    assert run("--seeds", "0,1,2", "--reuse") == 0
    assert state.stat().st_mtime_ns == trained_at
    assert not (out / "snap" / "full").exists() and not (out / "snap" / "full-seed1").exists()
    assert (out / "snap" / "full-seed2" / "metrics.json").exists()
    again = json.loads(kept.read_text())
    assert {s: again["variants"]["full"]["seeds"][s] for s in seeds} == seeds
    assert sorted(again["variants"]["full"]["seeds"]) == ["0", "1", "2"]
    assert again["seed_stats"]["random"]["n"] == 3
    # and once more, now from runs/'s own summary, whose rows have no checkpoints here
    shutil.rmtree(out / "snap" / "full-seed2")
    assert run("--seeds", "0,1,2", "--reuse") == 0
    assert not (out / "snap" / "full").exists()
    assert not (out / "snap" / "full-seed2").exists()  # nothing was trained again
    assert (
        json.loads(kept.read_text())["variants"]["full"]["seeds"]
        == again["variants"]["full"]["seeds"]
    )
    # The baselines read seed 0's checkpoint, gone with runs/: they are skipped, and the
    # document is still rendered (it used to stop with CheckpointError before the render).
    doc.unlink()
    assert run("--seeds", "0,1,2", "--reuse", baselines=True) == 0
    assert "baselines" not in json.loads(kept.read_text())
    assert "| snap | rnd |" in doc.read_text()

    # An ablation row added to the kept summary on another day's VM: the stream keeps the
    # full model's machine, the row records its own, and the table names both CPUs.
    shutil.rmtree(out)
    kept_summary = json.loads(kept.read_text())
    kept_summary["machine"] = {"cpu": "Yesterday's CPU", "cores": 2, "torch": "torch x"}
    del kept_summary["variants"]["full"]["machine"]  # as rows written before rows kept theirs
    kept.write_text(json.dumps(kept_summary))
    assert (
        main(
            ["--data", str(root), "--out", str(out), "--doc", str(doc), "--datasets", "snap"]
            + ["--epochs", "1", "--variants", "linear_time", "--mrr-k", "0", "--reuse"]
            + ["--no-baselines"]
        )
        == 0
    )
    after = json.loads(kept.read_text())
    assert after["machine"]["cpu"] == "Yesterday's CPU"
    assert after["variants"]["linear_time"]["machine"]["cpu"] == cpu_name()
    table = doc.read_text().split("## Ablation")[1].split("\n## ")[0]
    ablation = {
        line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| snap |")
    }
    assert ablation["state + pair features (default)"].endswith("| Yesterday's CPU |")
    assert ablation["linear time encoder only (time_encoder=linear)"].endswith(f"| {cpu_name()} |")
    assert "Yesterday's CPU" in doc.read_text().split("## Against")[0]


def test_link_seeds_added_to_a_labelled_stream_without_its_heads(data_dir, tmp_path) -> None:
    """``--no-node-classification``: the link rows of a labelled stream (named ``mooc``
    here, a prefix of it) are run and rendered, and no head is trained on them (without
    the switch, ``main`` trains heads there, writing their folder beside the rows)."""
    with gzip.open(data_dir / "mooc" / "edges.csv.gz", "rt") as f:
        lines = f.read().splitlines()[:3001]
    root = tmp_path / "data"
    (root / "mooc").mkdir(parents=True)
    with gzip.open(root / "mooc" / "edges.csv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    out, doc = tmp_path / "runs", tmp_path / "RESULTS.md"
    args = ["--data", str(root), "--out", str(out), "--doc", str(doc), "--datasets", "mooc"]
    args += ["--epochs", "1", "--no-ablation", "--mrr-k", "0", "--no-baselines", "--seeds", "0"]
    assert main([*args, "--no-node-classification"]) == 0
    assert (out / "mooc" / "summary.json").exists() and "| MOOC | rnd |" in doc.read_text()
    assert not (out / "mooc" / "node_classification").exists()
