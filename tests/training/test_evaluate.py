"""The streaming evaluator: DyGLib split, exact visibility, CLI outputs, baselines."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from model.checkpoint import save_checkpoint
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel
from training.baselines import edgebank_logits, recompute_scorer, run_baselines
from training.batches import IndexedStream
from training.data import chronological_split, read_edge_stream
from training.evaluate import evaluate_model, main
from training.replay import StreamReplay, build_queries, replay

N_EVENTS = 3000


@pytest.fixture(scope="module")
def uci(data_dir):
    stream = read_edge_stream(data_dir / "uci" / "edges.csv.gz", limit=N_EVENTS)
    return IndexedStream.build(stream), chronological_split(stream)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    m = DygMambaLinkModel(
        ModelConfig(d_model=16, d_state=8, identity_match_dim=8, time_norm={"scale": 300.0})
    )
    # make the state matter: larger read-out weights than the default init
    with torch.no_grad():
        for p in m.readout.parameters():
            p.mul_(5.0)
    return m.eval()


def test_split_quantiles_and_new_nodes(data_dir) -> None:
    stream = read_edge_stream(data_dir / "uci" / "edges.csv.gz")
    split = chronological_split(stream)
    assert split.val_time == pytest.approx(np.quantile(stream.t, 0.70))
    assert split.test_time == pytest.approx(np.quantile(stream.t, 0.85))
    n = len(stream)
    assert abs(split.val.sum() / n - 0.15) < 0.01 and abs(split.test.sum() / n - 0.15) < 0.01
    assert (stream.t[split.train] <= split.val_time).all() and (
        stream.t[split.test] > split.test_time
    ).all()
    # 10% of all nodes held out, all of them appear after val_time, none in training
    assert len(split.new_nodes) == int(0.1 * len(stream.nodes))
    train_nodes = set(stream.src[split.train]) | set(stream.dst[split.train])
    assert not (train_nodes & split.new_nodes)
    late = set(stream.src[stream.t > split.val_time]) | set(stream.dst[stream.t > split.val_time])
    assert split.new_nodes <= late
    # inductive test events touch a node unseen in training
    ind = split.inductive(stream, split.test)
    assert ind.any() and all(
        (s not in train_nodes) or (d not in train_nodes)
        for s, d in zip(stream.src[ind], stream.dst[ind], strict=True)
    )


def test_query_score_ignores_events_at_or_after_its_time(uci, model) -> None:
    """Exact visibility: removing every event at or after a query's time changes nothing."""
    data, split = uci
    q = build_queries(data, split, ("test",), ("transductive",), ("random", "historical"), 0)
    replay(model, data, q)
    # pick timestamps with several events (ties) and some singletons
    times, counts = np.unique(q.t[q.kind == "pos"], return_counts=True)
    picks = list(times[counts > 1][:3]) + list(times[counts == 1][::150][:3])
    assert picks
    for tau in picks:
        sel = q.t == tau
        before = data.t < tau
        truncated = IndexedStream.build(data.stream.slice(np.where(before)[0]))
        to_trunc = {nid: i for i, nid in enumerate(truncated.node_ids)}
        rep = StreamReplay(model, truncated)
        rep.ingest(np.arange(len(truncated)))
        # nodes that never occurred before tau are initial states in both replays
        ids = data.node_ids
        ok = np.array(
            [
                ids[s] in to_trunc and ids[d] in to_trunc
                for s, d in zip(q.src[sel], q.dst[sel], strict=True)
            ]
        )
        qs = np.array([to_trunc[ids[s]] for s in q.src[sel][ok]], dtype=np.int64)
        qd = np.array([to_trunc[ids[d]] for d in q.dst[sel][ok]], dtype=np.int64)
        got = rep.score(qs, qd, q.t[sel][ok])
        np.testing.assert_allclose(got, q.logit[sel][ok], atol=1e-5, rtol=0)
    # and scores do depend on the past (the test is not vacuous)
    assert np.std(q.logit) > 1e-3


def test_batch_visibility_differs_from_exact(uci, model) -> None:
    data, split = uci
    exact, _ = evaluate_model(
        model, data, split, ("test",), ("transductive",), ("random",), 0, "exact"
    )
    batch, _ = evaluate_model(
        model, data, split, ("test",), ("transductive",), ("random",), 0, "batch"
    )
    a, b = exact["test"]["transductive"]["random"], batch["test"]["transductive"]["random"]
    assert a["n_positives"] == b["n_positives"] and a["ap"] != b["ap"]


def test_edgebank_is_causal(uci) -> None:
    data, _ = uci
    e = 2500
    u, v, t = data.src[e : e + 1], data.dst[e : e + 1], data.t[e : e + 1]
    seen_before = bool(((data.src == u[0]) & (data.dst == v[0]) & (data.t < t[0])).any())
    assert edgebank_logits(data, u, v, t)[0] == float(seen_before)
    first = int(np.where((data.src == u[0]) & (data.dst == v[0]))[0][0])
    assert (
        edgebank_logits(data, u, v, data.t[first : first + 1])[0] == 0.0
    )  # not visible at its own time


def test_evaluate_cli_writes_beside_checkpoint(uci, model, tmp_path, data_dir) -> None:
    data, _ = uci
    ckpt = tmp_path / "ckpt"
    save_checkpoint(
        ckpt,
        model,
        {
            "history": [
                {
                    "epoch": 0,
                    "train_loss": 0.5,
                    "train_ap": 0.8,
                    "val_ap": 0.85,
                    "epoch_time_s": 1.0,
                    "eval_time_s": 0.5,
                }
            ]
        },
    )
    scores = tmp_path / "scores.csv"
    rc = main(
        [
            "--checkpoint",
            str(ckpt),
            "--data",
            str(data_dir / "uci" / "edges.csv.gz"),
            "--max-events",
            str(N_EVENTS),
            "--splits",
            "test",
            "--mrr-k",
            "3",
            "--write-scores",
            str(scores),
        ]
    )
    assert rc == 0
    outs = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt-eval-")]
    assert len(outs) == 1
    # nothing was written inside the checkpoint folder
    assert {p.name for p in ckpt.iterdir()} == {
        "config.json",
        "weights.safetensors",
        "checksums.json",
        "metrics.json",
    }
    out = outs[0]
    metrics = json.loads((out / "metrics.json").read_text())
    for setting in ("transductive", "inductive"):
        for strategy in ("random", "historical", "inductive"):
            assert 0.0 <= metrics["test"][setting][strategy]["ap"] <= 1.0
    assert 0.0 < metrics["test"]["mrr"]["mrr"] <= 1.0 and metrics["test"]["mrr"]["k"] == 3
    assert (out / "score_histograms.png").stat().st_size > 1000
    assert (out / "training_curves.png").stat().st_size > 1000
    rows = list(csv.DictReader(open(scores)))
    n_test = int(split_test_count(data))
    assert sum(r["is_positive"] == "1" for r in rows) == n_test
    assert {r["kind"] for r in rows} == {"pos", "random", "historical", "inductive", "mrr"}
    # the CSV reproduces the metrics
    from training.metrics import batched

    pos = {int(r["event"]): float(r["logit"]) for r in rows if r["kind"] == "pos"}
    neg = [r for r in rows if r["kind"] == "random" and r["setting"] == "transductive"]
    m = batched(
        np.array([pos[int(r["event"])] for r in neg]), np.array([float(r["logit"]) for r in neg])
    )
    assert m["ap"] == pytest.approx(metrics["test"]["transductive"]["random"]["ap"], abs=1e-9)
    # --out inside the checkpoint is refused
    with pytest.raises(SystemExit):
        main(
            [
                "--checkpoint",
                str(ckpt),
                "--data",
                str(data_dir / "uci"),
                "--out",
                str(ckpt / "x"),
                "--max-events",
                "500",
            ]
        )


def split_test_count(data: IndexedStream) -> int:
    return int(chronological_split(data.stream).test.sum())


def test_baselines_on_same_queries(uci, model) -> None:
    data, split = uci
    out = run_baselines(model, data, split, ("test",), recompute_window=8, mrr_k=0)
    eb = out["edgebank"]["test"]["transductive"]
    assert 0.5 < eb["random"]["ap"] <= 1.0
    assert (
        out["recompute"]["test"]["transductive"]["random"]["n_positives"]
        == eb["random"]["n_positives"]
    )


@pytest.mark.parametrize("visibility", ["exact", "batch"])
def test_recompute_over_the_whole_history_equals_the_cached_states(uci, model, visibility) -> None:
    """With a window longer than any node's history, re-scanning a query's endpoints
    from the initial state must give the cached states' scores, in the visibility the
    cached row is evaluated with: under batch visibility only the events the replay has
    ingested, not every event before the query's time."""
    data, split = uci
    cached = build_queries(data, split, ("test",), ("transductive",), ("random",), 0)
    rebuilt = build_queries(data, split, ("test",), ("transductive",), ("random",), 0)
    replay(model, data, cached, visibility)
    replay(model, data, rebuilt, visibility, scorer=recompute_scorer(model, data, len(data)))
    np.testing.assert_allclose(rebuilt.logit, cached.logit, atol=1e-4, rtol=0)


@pytest.mark.parametrize("reads_newest_neighbours", [False, True], ids=["own", "newest"])
def test_merged_groups_give_the_same_scores(uci, model, reads_newest_neighbours) -> None:
    """Batching conflict-free timestamp groups is exactly score-then-update per group,
    also for a model whose queries read their nodes' newest neighbours' records
    (``latest_transition_at_query``: a third node's record, which the merge must not
    have moved)."""
    data, split = uci
    if reads_newest_neighbours:
        torch.manual_seed(0)
        model = DygMambaLinkModel(
            model.config.with_updates(
                transition_buckets=16, latest_transition_count=True, latest_transition_at_query=True
            )
        )
    q1 = build_queries(data, split, ("test",), ("transductive",), ("random",), 3)
    q2 = build_queries(data, split, ("test",), ("transductive",), ("random",), 3)
    replay(model, data, q1, merge=True)
    replay(model, data, q2, merge=False)
    np.testing.assert_allclose(q1.logit, q2.logit, atol=1e-5, rtol=0)


@pytest.mark.parametrize("trained_with", ["batch", None], ids=["batch", "unrecorded"])
def test_evaluate_cli_defaults_to_the_trained_visibility(
    model, tmp_path, data_dir, trained_with
) -> None:
    """Without --visibility the evaluator replays the way the checkpoint was trained
    (batch on snapshot streams); a checkpoint that does not say is evaluated exactly."""
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, model, {"visibility": trained_with} if trained_with else {})
    out = tmp_path / "eval"
    args = ["--checkpoint", str(ckpt), "--data", str(data_dir / "uci" / "edges.csv.gz")]
    args += ["--max-events", str(N_EVENTS), "--splits", "test", "--mrr-k", "0"]
    assert main([*args, "--settings", "transductive", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["visibility"] == (trained_with or "exact")
