"""The node-classification trainer, evaluator and results section, on real data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model.checkpoint import load_checkpoint
from model.node_head import NodeClassifierHead, NodeHeadConfig, node_head_inputs
from model.node_head_checkpoint import load_node_head
from service.settings import DEFAULT_CHECKPOINT
from training import evaluate
from training.batches import IndexedStream
from training.data import read_edge_stream
from training.metrics import roc_auc
from training.node_classification import (
    DEPTH_CHOICE_Z,
    NODE_METRICS_FILE,
    RECENT_NEIGHBOUR_CHOICES,
    NodeTrainConfig,
    ReplayedInputs,
    asks_node_task,
    beats_beyond_noise,
    fit_head,
    fitted_head,
    train_node_classifier,
)
from training.node_evaluate import evaluate_node_checkpoint
from training.node_finetune import FineTuneConfig
from training.node_replay import collect_source_inputs
from training.node_results import BEGIN, END, update_doc
from training.replay import StreamReplay
from training.results import main as results_main
from training.train import main as train_main

N_EVENTS = 3000


@pytest.fixture(scope="module")
def wiki(data_dir):
    return data_dir / "wikipedia" / "edges.csv.gz"


def test_merged_replay_equals_one_timestamp_at_a_time(wiki):
    ckpt = load_checkpoint(DEFAULT_CHECKPOINT)
    data = IndexedStream.build(read_edge_stream(wiki, limit=1500))
    cfg = NodeHeadConfig(link_model_version=ckpt.version, d_readout=ckpt.config.d_out)
    merged = collect_source_inputs(ckpt.model, cfg, data)
    # The plain way: each timestamp group's sources read, then the group ingested.
    rep = StreamReplay(ckpt.model, data)
    plain = np.zeros_like(merged)
    cuts = np.r_[0, np.flatnonzero(np.diff(data.t)) + 1, len(data)]
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        plain[a:b] = node_head_inputs(
            ckpt.model,
            cfg,
            rep.states.select(torch.from_numpy(data.src[a:b])),
            torch.from_numpy(data.t[a:b]),
        ).numpy()
        rep.ingest(np.arange(a, b))
    np.testing.assert_allclose(merged, plain, atol=1e-5)
    # A source with no event at an earlier time reads the initial state: no events.
    first_t = np.full(data.num_nodes, np.inf)
    np.minimum.at(first_t, np.r_[data.src, data.dst], np.r_[data.t, data.t])
    seen = first_t[data.src] < data.t
    assert (~seen).any() and seen.any()
    assert (merged[~seen, -1] == 0).all() and (merged[~seen, -2] == 0).all()
    assert (merged[seen, -1] == 1).all() and (merged[seen, -2] > 0).all()


def test_fit_head_keeps_the_best_validation_epoch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6000, 5)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=6000) > 2.0).astype(np.int64)  # rare positives
    train, val = np.arange(6000) < 4000, np.arange(6000) >= 4000
    head = NodeClassifierHead(
        NodeHeadConfig(link_model_version="x", d_readout=5, use_activity=False)
    )
    history = fit_head(head, x, y, train, val, NodeTrainConfig(epochs=15, patience=15), log=False)
    best = max(h["val_auc"] for h in history)
    with torch.no_grad():
        val_auc = roc_auc(y[val], head(torch.from_numpy(x[val])).numpy())
    assert val_auc == pytest.approx(best, abs=1e-9)
    assert val_auc > 0.95


def replayed(x: np.ndarray, y: np.ndarray, head_config: NodeHeadConfig) -> ReplayedInputs:
    n = len(y)
    order = np.arange(n)
    masks = {"train": order < 0.7 * n, "val": (order >= 0.7 * n) & (order < 0.85 * n)}
    masks["test"] = order >= 0.85 * n
    return ReplayedInputs(Path("x"), "x", "x", n, head_config, x, y, masks, 0.0)


def test_the_trainer_keeps_the_recent_neighbour_depth_with_the_best_validation_auc():
    """Labels carried by the latest neighbour's bucket: the head that reads it wins on
    validation; labels carried by a numeric input alone: the smaller head is kept."""
    rng = np.random.default_rng(0)
    n = 6000
    numeric = rng.normal(size=(n, 3)).astype(np.float32)
    bucket = rng.integers(0, 16, n)
    config = NodeHeadConfig(
        link_model_version="x",
        d_readout=3,
        use_activity=False,
        use_recent_pace=False,
        recent_neighbours=1,
        neighbour_buckets=16,
    )
    x = np.concatenate([numeric, bucket[:, None].astype(np.float32)], axis=1)
    cfg = NodeTrainConfig(epochs=8, patience=8, members=1, use_activity=False, recent_pace=False)
    by_bucket = fitted_head(replayed(x, (bucket == 3).astype(np.int64), config), cfg)
    assert by_bucket.head.config.recent_neighbours == 1
    assert by_bucket.choice_val_auc[1] > by_bucket.choice_val_auc[0] + 0.2
    gain, error = by_bucket.choice_gain[1]
    assert gain > 0.2 and gain > DEPTH_CHOICE_Z * error
    assert by_bucket.inputs.x.shape[1] == 4
    # The head's shape is the config's, not the replay's; other input columns are refused.
    wide = fitted_head(
        replayed(x, (bucket == 3).astype(np.int64), config),
        cfg.model_copy(update={"members": 2, "hidden": 8, "epochs": 1}),
    )
    assert (wide.head.config.members, wide.head.config.hidden) == (2, 8)
    with pytest.raises(ValueError, match="replay"):
        fitted_head(replayed(x, bucket, config), cfg.model_copy(update={"recent_neighbours": 3}))
    by_numeric = fitted_head(replayed(x, (numeric[:, 0] > 1.5).astype(np.int64), config), cfg)
    assert by_numeric.head.config.recent_neighbours == 0
    assert by_numeric.inputs.x.shape[1] == 3  # the bucket column left out
    assert not by_numeric.choice_gain[1][0] > DEPTH_CHOICE_Z * by_numeric.choice_gain[1][1]


def test_a_deeper_head_must_beat_the_kept_one_beyond_the_validation_noise():
    """Few positives: a challenger a little ahead by chance is not taken; one clearly
    ahead on the same events is."""
    rng = np.random.default_rng(0)
    y = (rng.random(3000) < 0.006).astype(np.int64)  # 18 positives, like Wikipedia's 17
    kept = rng.normal(size=3000) + 2.0 * y
    ahead_by_chance = kept + rng.normal(size=3000) * 0.3
    taken, (gain, error) = beats_beyond_noise(y, kept, ahead_by_chance)
    assert roc_auc(y, ahead_by_chance) > roc_auc(y, kept)  # ahead, within noise
    assert not taken and 0 < gain < DEPTH_CHOICE_Z * error
    clearly = kept + 3.0 * y
    taken, (gain, error) = beats_beyond_noise(y, kept, clearly)
    assert taken and gain > DEPTH_CHOICE_Z * error
    # No positives: no verdict, the kept head stays.
    assert beats_beyond_noise(np.zeros(3000, dtype=np.int64), kept, clearly)[0] is False


def test_trainer_writes_a_checkpoint_the_evaluator_reproduces(wiki, tmp_path):
    out = tmp_path / "nc"
    metrics = train_node_classifier(
        wiki, DEFAULT_CHECKPOINT, out, NodeTrainConfig(epochs=3), max_events=N_EVENTS
    )
    base, nc = load_checkpoint(DEFAULT_CHECKPOINT), load_checkpoint(out)
    assert nc.version == base.version  # the link model's files, unchanged: same states
    head = load_node_head(out, nc.version)
    assert head is not None and head.version == metrics["head_version"]
    saved = json.loads((out / NODE_METRICS_FILE).read_text())
    assert saved["test"]["n_events"] > 0 and len(saved["history"]) <= 3
    # No depth given: one head per choice; the deeper one kept only when it beats the
    # smaller beyond the validation noise. (A split without both classes has no AUC:
    # JSON null, no verdict, and the smallest depth is kept.)
    tried = {int(k): v for k, v in saved["recent_neighbours_val_auc"].items()}
    assert sorted(tried) == list(RECENT_NEIGHBOUR_CHOICES)
    gain = saved["recent_neighbours_val_gain"]["1"]
    deeper = gain["gain"] is not None and gain["gain"] > DEPTH_CHOICE_Z * gain["std_error"]
    assert saved["recent_neighbours"] == head.config.recent_neighbours == (1 if deeper else 0)
    evaluated = evaluate_node_checkpoint(out, wiki, max_events=N_EVENTS)
    for split in ("val", "test"):
        assert evaluated[split]["n_positives"] == metrics[split]["n_positives"]
        if metrics[split]["n_positives"]:
            assert evaluated[split]["auc"] == pytest.approx(metrics[split]["auc"], abs=1e-6)


def test_fine_tuning_writes_its_own_link_model_that_the_evaluator_reads(wiki, tmp_path):
    out = tmp_path / "ft"
    cfg = NodeTrainConfig(epochs=3, fine_tune=FineTuneConfig(epochs=1))
    metrics = train_node_classifier(wiki, DEFAULT_CHECKPOINT, out, cfg, max_events=N_EVENTS)
    base, tuned = load_checkpoint(DEFAULT_CHECKPOINT), load_checkpoint(out)
    # Its own link model: other weights, so another version (and other cached states).
    assert tuned.version != base.version and metrics["model_version"] == tuned.version
    assert metrics["fine_tune"]["fine_tuned_from"] == base.version
    assert tuned.metrics["fine_tuned_from"] == base.version
    moved = [
        not torch.equal(a, b)
        for a, b in zip(base.model.parameters(), tuned.model.parameters(), strict=True)
    ]
    assert any(moved)
    assert 0.5 < metrics["fine_tune"]["link_val_ap_after"] <= 1.0  # link quality measured
    # The frozen head it started from is reported as it was before fine-tuning moved it.
    frozen = train_node_classifier(
        wiki,
        DEFAULT_CHECKPOINT,
        tmp_path / "frozen",
        cfg.model_copy(update={"fine_tune": None}),
        max_events=N_EVENTS,
    )
    assert metrics["base_frozen"]["test"]["auc"] == pytest.approx(frozen["test"]["auc"], abs=1e-9)
    head = load_node_head(out, tuned.version)
    assert head is not None and head.version == metrics["head_version"]
    assert head.config.link_model_version == tuned.version
    evaluated = evaluate_node_checkpoint(out, wiki, max_events=N_EVENTS)
    assert evaluated["model_version"] == tuned.version
    assert evaluated["test"]["n_positives"] > 0
    assert evaluated["test"]["auc"] == pytest.approx(metrics["test"]["auc"], abs=1e-6)


def test_a_stream_without_labels_is_refused(data_dir, tmp_path):
    with pytest.raises(ValueError, match="no label column"):
        train_node_classifier(
            data_dir / "bitcoin-otc", DEFAULT_CHECKPOINT, tmp_path / "x", NodeTrainConfig(), 500
        )


def test_task_dispatch(tmp_path):
    assert asks_node_task(["--task", "node-classification", "--data", "x"])
    assert asks_node_task(["--task=node-classification"])
    assert not asks_node_task(["--data", "node-classification"])
    # evaluate: a checkpoint with a head goes to the node evaluator unless --task link.
    assert not evaluate.wants_node_evaluation(["--checkpoint", str(DEFAULT_CHECKPOINT)])
    (tmp_path / "node_head.json").write_text("{}")
    assert evaluate.wants_node_evaluation(["--checkpoint", str(tmp_path)])
    assert not evaluate.wants_node_evaluation(["--checkpoint", str(tmp_path), "--task", "link"])


def head_run(seed: int, test_auc: float, **more) -> dict:
    """One head's entry of a node-classification summary."""
    return {
        "seed": seed,
        "epochs_run": 30,
        "val": {"auc": 0.9, "ap": 0.1},
        "test": {"auc": test_auc, "ap": 0.2, "n_positives": 30, "n_events": 23000},
        **more,
    }


def nc_summary(runs: list[dict]) -> dict:
    """A Wikipedia node-classification summary with these heads."""
    return {
        "dataset": "wikipedia",
        "base": "runs/wiki-link",
        "link_model_version": "abc",
        "link_budget": {"epochs": 2, "train_events": 10, "train_events_total": 10},
        "train_config": NodeTrainConfig().model_dump(),
        "runs": runs,
    }


def test_results_rewrites_only_its_section(tmp_path):
    doc = tmp_path / "RESULTS.md"
    doc.write_text("# Results\n\nlink tables\n")
    summary = nc_summary([head_run(0, 0.91), head_run(1, 0.93)])
    folder = tmp_path / "out" / "wikipedia" / "node_classification"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    assert update_doc(doc, tmp_path / "out")
    text = doc.read_text()
    assert text.startswith("# Results\n\nlink tables\n") and BEGIN in text and END in text
    assert "**92.00 ± 1.00**" in text and "JODIE 88.99" in text
    assert "test AUC per head 91.00, 93.00" in text
    # the hand-run example trains on the base the commands above make
    assert "--data ../shared/data/wikipedia --base runs/wiki-link --out runs/wiki-link-nc\n" in text
    doc.write_text(text.replace("link tables", "new link tables") + "\ntrailer\n")
    assert update_doc(doc, tmp_path / "out")
    again = doc.read_text()
    assert again.count(BEGIN) == 1 and "new link tables" in again and again.endswith("trailer\n")
    assert not update_doc(doc, tmp_path / "nothing")
    # A base that came out of --fine-tune is named so, with the command that made it.
    summary["link_fine_tuned_from"] = "0123456789abcdef"
    (folder / "summary.json").write_text(json.dumps(summary))
    assert update_doc(doc, tmp_path / "out")
    text = doc.read_text()
    assert "fine-tuned through a head from `0123456789abcdef`" in text
    assert "--base runs/wikipedia-link --out runs/wiki-link --fine-tune" in text
    # A later session, runs/ gone, reruns MOOC only: Wikipedia's row comes from the copy
    # kept beside the document instead of leaving the table.
    kept = tmp_path / "summaries"
    (kept / "node_classification").mkdir(parents=True)
    (kept / "node_classification" / "wikipedia.json").write_text(json.dumps(summary))
    mooc = {**summary, "dataset": "mooc", "base": "runs/mooc-link"}
    mooc_folder = tmp_path / "later" / "mooc" / "node_classification"
    mooc_folder.mkdir(parents=True)
    (mooc_folder / "summary.json").write_text(json.dumps(mooc))
    assert update_doc(doc, tmp_path / "later", kept=kept)
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| ")]
    assert any(r.startswith("| Wikipedia (banned editors) | **92.00") for r in rows)
    assert any(r.startswith("| MOOC (drop-out) | **92.00") for r in rows)
    # under its goal, a mean is not bold
    low = {**mooc, "runs": [{**run, "test": {**run["test"], "auc": 0.805}} for run in mooc["runs"]]}
    (mooc_folder / "summary.json").write_text(json.dumps(low))
    assert update_doc(doc, tmp_path / "later", kept=kept)
    assert "| MOOC (drop-out) | 80.50 ± 0.00 |" in doc.read_text()
    assert not update_doc(doc, tmp_path / "later", names=("wikipedia",))


def test_the_provenance_names_each_depth_choice_and_its_gain(tmp_path):
    """Heads of the standard-error rule say what the deeper depth gained and its error;
    heads made before it (no gains) still render."""
    choice = {"recent_neighbours": 0, "recent_neighbours_val_auc": {"0": 0.8810, "1": 0.8825}}
    run = head_run(
        0, 0.9, **choice, recent_neighbours_val_gain={"1": {"gain": 0.0015, "std_error": 0.004}}
    )
    no_verdict = {"1": {"gain": None, "std_error": None}}
    summary = nc_summary([run, head_run(1, 0.9, **choice, recent_neighbours_val_gain=no_verdict)])
    folder = tmp_path / "out" / "wikipedia" / "node_classification"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    doc = tmp_path / "RESULTS.md"
    doc.write_text("# Results\n")
    assert update_doc(doc, tmp_path / "out")
    text = doc.read_text()
    assert "latest neighbours read: 0, 0" in text
    assert "standard error: 1: +0.15 ± 0.40; 1: n/a)" in text
    old = nc_summary([head_run(0, 0.9, **choice)])
    (folder / "summary.json").write_text(json.dumps(old))
    assert update_doc(doc, tmp_path / "out")
    assert "gain of each deeper depth" not in doc.read_text()


def test_heads_on_several_link_models_share_one_row(wiki, tmp_path):
    """``--nc-base NAME=A,B``: every head seed on each link checkpoint (link seeds), all
    heads in the row's mean, and commands that remake each link model with its seed."""
    root = tmp_path / "data"
    (root / "wikipedia").mkdir(parents=True)
    with gzip.open(wiki, "rt") as f:
        lines = f.read().splitlines()[: N_EVENTS + 1]
    with gzip.open(root / "wikipedia" / "edges.csv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    second = tmp_path / "link-seed1"
    common = ["--threads", "1", "--no-progress"]
    assert (
        train_main(
            ["--data", str(root / "wikipedia"), "--out", str(second), "--epochs", "1"]
            + ["--seed", "1", *common]
        )
        == 0
    )
    out, doc = tmp_path / "runs", tmp_path / "RESULTS.md"
    argv = ["--node-classification", "--data", str(root), "--out", str(out), "--doc", str(doc)]
    argv += ["--datasets", "wikipedia", "--nc-base", f"wikipedia={DEFAULT_CHECKPOINT},{second}"]
    assert results_main([*argv, "--nc-seeds", "0", "--threads", "1"]) == 0
    folder = out / "wikipedia" / "node_classification"
    summary = json.loads((folder / "summary.json").read_text())
    versions = [load_checkpoint(DEFAULT_CHECKPOINT).version, load_checkpoint(second).version]
    assert [link["link_model_version"] for link in summary["links"]] == versions
    assert summary["links"][1]["link_seed"] == 1
    assert [(r["link"], r["seed"]) for r in summary["runs"]] == [(0, 0), (1, 0)]
    # Each head is saved beside its own link model's files, and reads that model's states.
    for index, name in enumerate(("checkpoint-seed0", "checkpoint-link1-seed0")):
        assert load_checkpoint(folder / name).version == versions[index]
        head = load_node_head(folder / name, versions[index])
        assert head is not None and head.version == summary["runs"][index]["head_version"]
    text = doc.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| Wikipedia"))
    aucs = [r["test"]["auc"] for r in summary["runs"] if r["test"]["auc"] is not None]
    assert "| 2 (2 links × 1 seed) |" in row
    assert row.split(" | ")[1].strip("*").startswith(f"{100 * sum(aucs) / len(aucs):.2f}")
    assert f"--nc-base wikipedia={DEFAULT_CHECKPOINT},{second} --nc-seeds 0" in text
    assert f"--out {second} --epochs 1 --seed 1\n" in text
    assert f"`{versions[1]}`: " in text  # per-head AUCs grouped by link model
