"""The trainer: trains as it is served, saves a checkpoint with its history, resumes.

Small: a slice of 2,000 UCI events, one epoch, one torch thread.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from model.checkpoint import load_checkpoint
from model.events import endpoint_events
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.streaming import NeighbourLists, advance, score
from training.batches import IndexedStream, NodeEventIndex
from training.data import chronological_split, read_edge_stream
from training.replay import Queries, build_queries, replay
from training.train import DEFAULT_PATIENCE, TRAIN_STATE_DIR, EpochRunner, train

N_EVENTS = 2000
# A tiny model on 1,500 events, no test pass: for tests of what the trainer chooses.
TINY_RUN = {
    "config": {"d_model": 8, "d_state": 4, "d_time": 4, "head_hidden": 16},
    "max_events": 1500,
    "progress": False,
    "test_eval": False,
    "window": 4,
}


@pytest.fixture(scope="module")
def uci_path(data_dir):
    return data_dir / "uci" / "edges.csv.gz"


@pytest.fixture(scope="module")
def trained(uci_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    version = train(
        uci_path,
        out,
        {"d_model": 16, "d_state": 8, "identity_match_dim": 8, "identity_match_depth": 2},
        epochs=1,
        max_events=N_EVENTS,
        progress=False,
        window=8,
    )
    return out, version


@pytest.fixture(scope="module")
def uci_slice(uci_path):
    stream = read_edge_stream(uci_path, limit=N_EVENTS)
    return IndexedStream.build(stream), chronological_split(stream)


def test_checkpoint_and_metrics(trained) -> None:
    out, version = trained
    ckpt = load_checkpoint(out)
    assert ckpt.version == version
    assert ckpt.config.edge_feature_dim == 0 and ckpt.config.d_model == 16
    assert (
        ckpt.config.time_norm.scale > 0 and ckpt.config.time_norm.scale != 1.0
    )  # fitted on the train split
    m = json.loads((out / "metrics.json").read_text())
    assert m["best_epoch"] == 0 and len(m["history"]) == 1
    for key in ("train_loss", "train_ap", "val_ap", "epoch_time_s", "eval_time_s"):
        assert np.isfinite(m["history"][0][key])
    assert 0.5 < m["val"]["ap"] <= 1.0 and 0.5 < m["test"]["ap"] <= 1.0
    assert (out / TRAIN_STATE_DIR / "optimizer.safetensors").exists()
    assert not list(out.rglob("*.pt")) and not list(out.rglob("*.pkl"))


def test_evaluator_equals_event_by_event_advance_and_score(trained, uci_slice) -> None:
    """The evaluator's scores equal a naive replay: one advance() per event, score() per query."""
    model = load_checkpoint(trained[0]).model
    data, split = uci_slice
    q = build_queries(data, split, ("test",), ("transductive",), ("random",), 0)
    replay(model, data, q)

    states = NodeStates.initial(data.num_nodes, model.config)
    lists: list[list[tuple[int, float]]] = [[] for _ in range(data.num_nodes)]
    L = model.config.neighbour_list_len
    order = np.argsort(q.t, kind="stable")
    expected = np.full(len(q), np.nan)
    qi = 0

    def nl(nodes):
        return NeighbourLists.from_lists(
            [[k for k, _ in lists[n]] for n in nodes], [[t for _, t in lists[n]] for n in nodes], L
        )

    for e in range(len(data) + 1):
        t_e = data.t[e] if e < len(data) else np.inf
        # score every query at or before this event's time (it must not see this event)
        j = qi
        while j < len(order) and q.t[order[j]] <= t_e:
            j += 1
        if j > qi:
            sel = order[qi:j]
            s, d = q.src[sel], q.dst[sel]
            expected[sel] = score(
                model,
                states.select(torch.from_numpy(s)),
                states.select(torch.from_numpy(d)),
                torch.from_numpy(data.keys[s]),
                torch.from_numpy(data.keys[d]),
                torch.from_numpy(q.t[sel]),
                nl(s),
                nl(d),
            ).numpy()
            qi = j
        if e == len(data):
            break
        u, v = int(data.src[e]), int(data.dst[e])
        a, b = endpoint_events(int(data.keys[u]), int(data.keys[v]), [], float(data.t[e]), e)
        if u == v:
            new = advance(model, states.select([u]), [[a, b]])
            states.h[u], states.conv[u], states.t_last[u], states.n_events[u] = (
                new.h[0],
                new.conv[0],
                new.t_last[0],
                new.n_events[0],
            )
        else:
            new = advance(model, states.select([u, v]), [[a], [b]])
            for i, n in enumerate((u, v)):
                states.h[n], states.conv[n], states.t_last[n], states.n_events[n] = (
                    new.h[i],
                    new.conv[i],
                    new.t_last[i],
                    new.n_events[i],
                )
        lists[u].append((int(data.keys[v]), float(data.t[e])))
        lists[v].append((int(data.keys[u]), float(data.t[e])))
    assert not np.isnan(expected).any()
    np.testing.assert_allclose(q.logit, expected, atol=1e-4, rtol=0)


SNAPSHOT_COUNTS = {"snapshot_pair_features": True}
ROLE_COUNTS = {**SNAPSHOT_COUNTS, "role_counts": True, "role_count_unit": 200000.0}
# every transition record, and the latest transition count (an experiment the service
# does not serve yet: model/transition_counts.latest_transition_counts)
TRANSITION_COUNTS = {
    "transition_buckets": 16,
    "transition_decay": 259_200.0,
    "transition_order2": True,
    "latest_transition_count": True,
}
# the same count read at the query from the newest neighbour's record
TRANSITION_COUNTS_AT_QUERY = {**TRANSITION_COUNTS, "latest_transition_at_query": True}


@pytest.mark.parametrize(
    ("coarse", "historical", "extra", "visibility", "fresh"),
    [
        (False, 0.0, False, "exact", None),
        (True, 0.0, False, "exact", None),
        (False, 0.5, False, "exact", None),
        (False, 0.5, True, "exact", None),
        (True, 0.0, False, "batch", None),
        (True, 0.0, False, "batch", SNAPSHOT_COUNTS),
        (True, 0.0, False, "batch", ROLE_COUNTS),
        (False, 0.0, False, "exact", ROLE_COUNTS),
        (False, 0.5, False, "exact", TRANSITION_COUNTS),
        (True, 0.0, False, "batch", TRANSITION_COUNTS),
        (False, 0.5, False, "exact", TRANSITION_COUNTS_AT_QUERY),
        (True, 0.0, False, "batch", TRANSITION_COUNTS_AT_QUERY),
    ],
    ids=[
        "uci-times",
        "coarse-times",
        "historical-negatives",
        "extra-historical-negatives",
        "coarse-times-batch",
        "coarse-times-batch-snapshot-counts",
        "coarse-times-batch-role-counts",
        "uci-times-role-counts",
        "uci-times-latest-transition-counts",
        "coarse-times-batch-latest-transition-counts",
        "uci-times-latest-transition-counts-at-query",
        "coarse-times-batch-latest-transition-counts-at-query",
    ],
)
def test_trainer_scores_equal_streaming_scores(
    trained, uci_slice, coarse, historical, extra, visibility, fresh
) -> None:
    """The trainer's windowed re-scan gives the logits the service computes.

    "coarse-times" rounds UCI's timestamps to ~2.3-day steps, so hundreds of events share
    a timestamp (like Can. Parl. / US Legis.) and the trainer's catch-up path runs.
    "historical-negatives" mixes whole-pair negatives (another source than the positive's)
    into the batches, so their states and lists are checked too; "extra-" adds them on
    top of the random ones (more negatives than positives, each at its positive's time).
    "coarse-times-batch": batch visibility (what the trainer picks on snapshot streams),
    where a query sees the events of earlier batches at its own timestamp, in its
    neighbour lists too, against the evaluator's batch groups of the same size.
    "-snapshot-counts": the same with the snapshot pair features (a fresh model);
    "-role-counts": and the role-count records (the trainer's prefix records against the
    evaluator's per-batch advance; in units of one coarse step), also on UCI's own times.
    "-latest-transition-counts": the transition records (raw, decayed, second order) and
    the latest transition count, the trainer's prefix index against the replay's walk;
    "-at-query": that count read from the newest neighbour's record as the query sees it.
    """
    model = load_checkpoint(trained[0]).model
    if fresh:
        torch.manual_seed(0)
        model = DygMambaLinkModel(model.config.with_updates(**fresh))
    data, split = uci_slice
    if coarse:
        stream = data.stream.slice(np.arange(len(data)))
        stream.t = np.floor(stream.t / 200000.0) * 200000.0
        data = IndexedStream.build(stream)
        split = chronological_split(stream)
    train_events = np.where(split.train)[0]
    index = NodeEventIndex.build(data, train_events)
    runner = EpochRunner(
        model,
        data,
        train_events,
        index,
        window=4,
        visibility=visibility,
        historical_negatives=historical,
        historical_extra=extra,
    )
    runner.catch_up_len = 8
    rng = np.random.default_rng(0)
    got, qs, qd, qt, qe = [], [], [], [], []
    with torch.no_grad():
        for b0 in range(0, len(train_events), 150):
            b1 = min(b0 + 150, len(train_events))
            _, logits, _ = runner.batch_loss(b0, b1, rng)
            lb = runner.last_batch
            got.append(logits)
            qs += [lb["src"], lb["neg_src"]]
            qd += [lb["dst"], lb["neg"]]
            qt += [lb["t"], lb["neg_t"]]
            qe += [np.arange(b0, b1), b0 + lb["neg_rows"]]
    got = np.concatenate(got)
    n_neg, n_pos = sum(len(x) for x in qs[1::2]), sum(len(x) for x in qs[0::2])
    if historical and not extra:
        assert (np.concatenate(qs[1::2]) != np.concatenate(qs[0::2])).any()
    assert (n_neg > n_pos) == extra
    # The same queries replayed through streaming.advance/score over the training events only.
    sub = IndexedStream.build(data.stream.slice(train_events))
    to_sub = {nid: i for i, nid in enumerate(sub.node_ids)}
    remap = np.array([to_sub.get(nid, -1) for nid in data.node_ids])
    q = Queries(
        remap[np.concatenate(qs)],
        remap[np.concatenate(qd)],
        np.concatenate(qt),
        np.concatenate(qe),
        np.full(len(got), "x", dtype=object),
        np.full(len(got), "", dtype=object),
        np.full(len(got), "train", dtype=object),
    )
    q.logit = np.full(len(q), np.nan)
    assert (q.src >= 0).all() and (q.dst >= 0).all()
    replay(model, sub, q, visibility, batch_events=150)
    np.testing.assert_allclose(got, q.logit, atol=1e-4, rtol=0)
    if visibility == "batch":
        # Not vacuous: some queries share their timestamp with events of earlier batches
        # (the first event at a query's time comes before the query's batch).
        batch_start = np.concatenate(qe) // 150 * 150
        first_at_t = np.searchsorted(sub.t, np.concatenate(qt), side="left")
        assert (first_at_t < batch_start).any()


@pytest.mark.parametrize("weight_average_decay", [0.0, 0.9])
def test_resume_continues_exactly(uci_path, tmp_path, weight_average_decay) -> None:
    kw = dict(
        config={"d_model": 8, "d_state": 4, "d_time": 4, "head_hidden": 16},
        max_events=1200,
        progress=False,
        test_eval=False,
        window=4,
        patience=5,
        weight_average_decay=weight_average_decay,
    )
    straight = tmp_path / "straight"
    train(uci_path, straight, epochs=2, **kw)
    split_run = tmp_path / "split"
    train(uci_path, split_run, epochs=1, **kw)
    state = json.loads((split_run / TRAIN_STATE_DIR / "state.json").read_text())
    assert state["epoch"] == 0
    train(uci_path, split_run, epochs=2, resume=True, **kw)
    a = json.loads((straight / TRAIN_STATE_DIR / "state.json").read_text())["history"]
    b = json.loads((split_run / TRAIN_STATE_DIR / "state.json").read_text())["history"]
    assert len(a) == len(b) == 2
    for ra, rb in zip(a, b, strict=True):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], abs=1e-7)
        assert ra["val_ap"] == pytest.approx(rb["val_ap"], abs=1e-7)
    from safetensors.torch import load_file

    wa = load_file(str(straight / TRAIN_STATE_DIR / "model.safetensors"))
    wb = load_file(str(split_run / TRAIN_STATE_DIR / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-6)
    # and the checkpoints, which hold the average where there is one
    ca, cb = (
        load_checkpoint(straight).model.state_dict(),
        load_checkpoint(split_run).model.state_dict(),
    )
    for k in ca:
        torch.testing.assert_close(ca[k], cb[k], rtol=0, atol=1e-6)


def test_the_checkpoint_keeps_the_weight_average(uci_path, tmp_path) -> None:
    """With an average, validation and the checkpoint use it; the optimiser's own weights
    (what a resume goes on from) are the last step's."""
    from safetensors.torch import load_file

    train(uci_path, tmp_path, epochs=1, weight_average_decay=0.9, **TINY_RUN)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.metrics["weight_average_decay"] == 0.9
    own = load_file(str(tmp_path / TRAIN_STATE_DIR / "model.safetensors"))
    averaged = load_file(str(tmp_path / TRAIN_STATE_DIR / "average.safetensors"))
    params = [name for name, _ in ckpt.model.named_parameters()]
    kept = ckpt.model.state_dict()
    for i, name in enumerate(params):
        torch.testing.assert_close(kept[name], averaged[str(i)], rtol=0, atol=0)
    assert any(not torch.equal(kept[name], own[name]) for name in params)


def test_an_epoch_that_is_no_better_is_undone_at_a_smaller_rate(uci_path, tmp_path) -> None:
    """plateau_lr_factor: after an epoch that does not beat the best validation score,
    the model and optimizer go back to the best epoch's and the rate shrinks. A rate of
    0.2 makes this tiny run alternate: epochs 2 and 4 are worse than the best before."""
    from safetensors.torch import load_file

    train(uci_path, tmp_path, epochs=5, lr=0.2, patience=10, plateau_lr_factor=0.5, **TINY_RUN)
    state = json.loads((tmp_path / TRAIN_STATE_DIR / "state.json").read_text())
    history = state["history"]
    assert [r["lr"] for r in history][0] == 0.2
    best, new_best = -1.0, []
    for r in history:
        new_best.append(r["val_score"] > best)
        best = max(best, r["val_score"])
    for before, after, improved in zip(history, history[1:], new_best, strict=False):
        assert after["lr"] == pytest.approx(before["lr"] * (1.0 if improved else 0.5))
    assert not all(new_best[:-1]) and not new_best[-1]  # a bad epoch inside, and at the end
    # the last epoch was undone: the state to resume from is the best epoch's weights,
    # and the next epoch would run at half the last one's rate
    saved = load_file(str(tmp_path / TRAIN_STATE_DIR / "model.safetensors"))
    best_weights = load_checkpoint(tmp_path).model.state_dict()
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, best_weights[name], rtol=0, atol=0)
    assert state["param_groups"][0]["lr"] == pytest.approx(history[-1]["lr"] * 0.5)
    assert load_checkpoint(tmp_path).metrics["best_epoch"] == int(
        np.argmax([r["val_score"] for r in history])
    )


def test_several_negatives_per_positive_train(uci_path, tmp_path) -> None:
    train(uci_path, tmp_path, epochs=1, negatives_per_positive=3, **TINY_RUN)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.metrics["negatives_per_positive"] == 3
    assert 0.5 < ckpt.metrics["val"]["ap"] <= 1.0
    with pytest.raises(ValueError):
        train(uci_path, tmp_path / "x", epochs=1, negatives_per_positive=0, **TINY_RUN)


def test_feature_only_ablation_trains(uci_path, tmp_path) -> None:
    train(
        uci_path,
        tmp_path,
        {"use_state": False},
        epochs=1,
        max_events=1200,
        progress=False,
        test_eval=False,
    )
    ckpt = load_checkpoint(tmp_path)
    assert not ckpt.config.use_state
    assert 0.5 < ckpt.metrics["val"]["ap"] <= 1.0


def test_batch_visibility_training_runs(uci_path, tmp_path) -> None:
    train(
        uci_path,
        tmp_path,
        {"d_model": 8, "d_state": 4},
        epochs=1,
        max_events=1200,
        progress=False,
        test_eval=False,
        visibility="batch",
        window=4,
    )
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.metrics["visibility"] == "batch" and 0.0 < ckpt.metrics["val"]["ap"] <= 1.0
    # Batch visibility without dense snapshots (UCI has none): epochs are still chosen on
    # random negatives, with the default patience.
    assert (ckpt.metrics["select_on"], ckpt.metrics["patience"]) == ("random", DEFAULT_PATIENCE)
    assert "val_ap_inductive" not in ckpt.metrics["history"][0]


@pytest.mark.parametrize("auto", [True, False], ids=["auto", "no-auto"])
def test_default_command_takes_settings_from_the_stream(data_dir, tmp_path, auto) -> None:
    """MOOC is bipartite with a small item side: the trainer chooses lists of 128 by
    itself (auto_config, without the identity match), records why, and --no-auto keeps
    the plain defaults."""
    train(data_dir / "mooc" / "edges.csv.gz", tmp_path, epochs=1, auto=auto, **TINY_RUN)
    ckpt = load_checkpoint(tmp_path)
    chosen = ckpt.metrics["auto"]
    assert chosen["profile"]["bipartite"]
    if auto:
        assert ckpt.config.neighbour_list_len == 128
        assert ckpt.config.identity_match_dim == 0
        assert any("bipartite" in r for r in chosen["reasons"])
        assert ckpt.metrics["historical_negatives"] == chosen["historical_negatives"]
    else:
        assert ckpt.config.identity_match_dim == 0 and ckpt.config.neighbour_list_len == 32
        assert chosen["reasons"] == [] and ckpt.metrics["historical_negatives"] == 0.0


def test_selection_on_the_mean_of_three_negative_kinds(uci_path, tmp_path, capsys) -> None:
    """--select-on mean: every epoch records the historical and inductive validation AP
    beside the random one, the best epoch is the one with the highest mean of the three,
    and its metrics say what it was chosen on. Without the progress bar, each epoch
    still prints one line with the score it is selected on (what a log shows)."""
    train(uci_path, tmp_path, epochs=3, select_on="mean", **TINY_RUN)
    ckpt = load_checkpoint(tmp_path)
    history = ckpt.metrics["history"]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 3
    for line, row in zip(lines, history, strict=True):
        assert f"selection score {row['val_score']:.4f}" in line
    assert len(history) == 3 and ckpt.metrics["select_on"] == "mean"
    for row in history:
        kinds = [row["val_ap"], row["val_ap_historical"], row["val_ap_inductive"]]
        assert all(0.0 < ap <= 1.0 for ap in kinds)
        assert row["val_score"] == pytest.approx(np.mean(kinds), abs=1e-12)
    scores = [row["val_score"] for row in history]
    assert ckpt.metrics["best_epoch"] == int(np.argmax(scores))
    best = history[ckpt.metrics["best_epoch"]]
    assert ckpt.metrics["val"]["score"] == best["val_score"]
    assert ckpt.metrics["val"]["ap_inductive"] == best["val_ap_inductive"]


def test_selection_by_default_is_on_random_negatives(trained) -> None:
    m = json.loads((trained[0] / "metrics.json").read_text())
    assert m["select_on"] == "random" and "val_ap_historical" not in m["history"][0]
    assert m["history"][0]["val_score"] == m["history"][0]["val_ap"]


def test_selection_criterion_is_checked(uci_path, tmp_path) -> None:
    with pytest.raises(ValueError, match="select_on"):
        train(uci_path, tmp_path, epochs=1, max_events=500, progress=False, select_on="median")
