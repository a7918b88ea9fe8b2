"""The offline trainer of the causal DyG-Mamba link model, trained as it is served.

One epoch walks the training split in time order, in batches of events. For each
batch, every touched node (endpoints and negative destinations) is re-scanned with
``model.scan(..., return_states=True)`` from a carried, DETACHED state of about
``window`` events earlier (its "anchor") through the batch's events, so gradients
flow through the scan over several steps. Each positive (u, v, t) and one random
negative (u, n, t) (n drawn from the training destinations) are scored from each
node's state after its last event with time STRICTLY < t (exact visibility: events
at the same timestamp never see each other), decayed to t (``model.node_readout``),
plus ``pair_features`` from the recent-neighbour lists restricted to times < t,
through ``model.head_logit``. BCE, Adam, gradient clipping.

With ``visibility="batch"`` a query reads the states and lists as of the start of its
batch instead (TGN memory style), for comparison.

After every epoch the STREAMING evaluator (``evaluate.validation_metrics``: the same
``streaming.advance``/``streaming.score`` the service runs) measures validation AP,
with random negatives or, with ``select_on="mean"``, the mean over random, historical
and inductive ones; the best epoch is saved with ``save_checkpoint`` (early stopping
with ``patience``).
Training is resumable: optimizer, model and bookkeeping go to ``out/train_state/``
(safetensors + JSON, never pickle) after every epoch.

CLI::

    python -m training.train --data PATH --out DIR [--epochs N] [--batch-size B] [--lr LR]
        [--seed S] [--patience P] [--max-events N] [--window W] [--visibility exact|batch]
        [--select-on random|mean] [--resume] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import math
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from model.checkpoint import load_checkpoint, save_checkpoint
from model.config import ModelConfig
from model.link_model import DygMambaLinkModel
from model.node_state import NodeStates
from model.pair_features import pair_inputs
from model.time_encoding import fit_time_normalisation

from .auto_config import DEFAULT_PATIENCE, AutoSettings, StreamProfile, choose_settings
from .batches import IndexedStream, NodeEventIndex, PrefixTransitions
from .data import chronological_split, read_edge_stream
from .evaluate import SELECTION_NEGATIVES, evaluate_model, validation_metrics
from .jsonable import jsonable
from .metrics import average_precision, roc_auc
from .negatives import TrainNegativeSampler
from .node_task import asks_node_task
from .weight_average import WeightAverage

TRAIN_STATE_DIR = "train_state"
# Train to convergence: the paper's 100-epoch ceiling, ended by early stopping on the
# streaming validation AP (the paper's patience is 20; ours is shorter for 2-core budgets).
DEFAULT_MAX_EPOCHS = 100
SCAN_CHUNK = 1
ROW_BUDGET = 4096  # rows x padded length per scan call (bounds memory; rows of similar length)


# ===================================================================== helpers
def training_gaps(index: NodeEventIndex) -> torch.Tensor:
    """Per-node inter-event gaps of the training split (float64)."""
    same_node = np.ones(len(index.t), dtype=bool)
    same_node[index.offsets[:-1][index.count(np.arange(index.num_nodes)) > 0]] = False
    gaps = np.diff(index.t, prepend=np.nan)[same_node]
    return torch.from_numpy(gaps[np.isfinite(gaps)])


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def _set_rows(states: NodeStates, idx: torch.Tensor, new: NodeStates) -> None:
    states.h[idx] = new.h.detach()
    states.conv[idx] = new.conv.detach()
    states.t_last[idx] = new.t_last
    states.last_seq[idx] = new.last_seq
    states.n_events[idx] = new.n_events


def _buckets(lengths: np.ndarray, budget: int = ROW_BUDGET) -> list[np.ndarray]:
    """Group rows of similar padded length (longest first) under a rows x length budget."""
    order = np.argsort(-lengths, kind="stable")
    out, start = [], 0
    while start < len(order):
        t_max = max(int(lengths[order[start]]), 1)
        rows = max(1, budget // t_max)
        out.append(order[start : start + rows])
        start += rows
    return out


# ===================================================================== the epoch
class EpochRunner:
    """Walks the training split once; holds the carried (detached) anchor states."""

    def __init__(
        self,
        model: DygMambaLinkModel,
        data: IndexedStream,
        train_events: np.ndarray,
        index: NodeEventIndex,
        window: int,
        visibility: str,
        historical_negatives: float = 0.0,
        historical_extra: bool = False,
        negatives_per_positive: int = 1,
    ) -> None:
        self.model, self.data, self.events, self.index = model, data, train_events, index
        self.window, self.visibility = window, visibility
        self.catch_up_len = max(4 * window, 64)
        self.negatives = TrainNegativeSampler(
            data.src[train_events],
            data.dst[train_events],
            data.num_nodes,
            historical_negatives,
            historical_extra,
            negatives_per_positive,
        )
        # with several negatives per positive, the positives weigh as much as all the
        # negatives together (as with one each); None keeps one negative's loss to the bit
        self.positive_weight = (
            torch.tensor(float(negatives_per_positive)) if negatives_per_positive > 1 else None
        )
        n = data.num_nodes
        self.anchor = NodeStates.initial(n, model.config)
        self.anchor_count = np.zeros(n, dtype=np.int64)  # events folded into the anchor
        self.done = np.zeros(n, dtype=np.int64)  # events of the epoch applied so far

    def _scan_rows(
        self, nodes: np.ndarray, start: np.ndarray, stop: np.ndarray, init: NodeStates
    ) -> tuple[NodeStates, torch.Tensor | None]:
        ev, lengths = self.index.event_inputs(self.data, nodes, start, stop)
        if ev.t.shape[1] == 0:
            return init, None
        return self.model.scan(init, ev, lengths, return_states=True, chunk=SCAN_CHUNK)

    def _latest_at_query(self, nodes: np.ndarray, m: np.ndarray, t: np.ndarray) -> np.ndarray:
        """``latest_transition_at_query`` of query nodes after their first ``m`` events,
        each newest neighbour read as the same query sees it (its own visible prefix)."""
        idx, cfg = self.index, self.model.config

        def seen(newest: np.ndarray) -> np.ndarray:
            if self.visibility == "exact":
                return idx.prefix_count(newest, t)
            return self.done[newest]

        return idx.latest_at_query(nodes, m, seen, cfg.transition_buckets, cfg.transition_decay)

    def batch_loss(
        self, b0: int, b1: int, rng: np.random.Generator
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        d, idx, cfg = self.data, self.index, self.model.config
        ev = self.events[b0:b1]
        u, v, t = d.src[ev], d.dst[ev], d.t[ev]
        neg_src, neg_dst, neg_rows = self.negatives.sample(rng, b0, b1)
        neg_t = t[neg_rows]
        n_q, n_neg = len(ev), len(neg_src)
        q_nodes = np.concatenate([u, v, neg_src, neg_dst])
        q_t = np.concatenate([t, t, neg_t, neg_t])
        if self.visibility == "exact":
            q_m = idx.prefix_count(q_nodes, q_t)
        else:
            q_m = self.done[q_nodes].copy()
        touched = np.unique(q_nodes)
        end = (
            self.done[touched] + np.bincount(np.concatenate([u, v]), minlength=d.num_nodes)[touched]
        )
        a = self.anchor_count[touched]
        if self.visibility == "exact":
            t_next = d.t[self.events[b1]] if b1 < len(self.events) else np.inf
            keep = idx.prefix_count(touched, np.full(len(touched), t_next))
        else:
            keep = end
        a_new = np.maximum(a, np.minimum(end - self.window, keep))

        row_of = np.full(d.num_nodes, -1, dtype=np.int64)
        row_of[touched] = np.arange(len(touched))
        q_rows = row_of[q_nodes]
        # Scan only as far as some query (or the new anchor) needs: a node's events
        # after its last queried prefix are picked up by a later batch.
        need = np.zeros(len(touched), dtype=np.int64)
        np.maximum.at(need, q_rows, q_m)
        stop = np.maximum(need, a_new)
        q_off = q_m - a[q_rows]  # position in [anchor, scan1..., scan2...]
        if (q_off < 0).any():
            raise AssertionError("a query needs a state older than its node's anchor")

        z = None
        if cfg.use_state:
            n_layers, di, ds = cfg.n_layers, cfg.d_inner, cfg.d_state
            q_h = torch.zeros(len(q_nodes), n_layers, di, ds)
            new_anchor = NodeStates.initial(len(touched), cfg)
            for rows in _buckets(stop - a):
                sel = torch.from_numpy(touched[rows])
                init = self.anchor.select(sel)
                # Catching up over a long stretch (e.g. after a timestamp shared by
                # thousands of events) runs without gradient: truncated BPTT keeps
                # the gradient window at about ``window`` events.
                catch_up = int((a_new[rows] - a[rows]).max()) > self.catch_up_len
                with torch.set_grad_enabled(torch.is_grad_enabled() and not catch_up):
                    mid, pp1 = self._scan_rows(touched[rows], a[rows], a_new[rows], init)
                _, pp2 = self._scan_rows(touched[rows], a_new[rows], stop[rows], mid)
                # All per-position states of these rows: [anchor, scan1..., scan2...].
                parts = [init.h.unsqueeze(1)]
                t1 = pp1.shape[1] if pp1 is not None else 0
                if pp1 is not None:
                    parts.append(pp1)
                if pp2 is not None:
                    parts.append(pp2)
                h_all = torch.cat(parts, dim=1)
                len1 = a_new[rows] - a[rows]
                local = np.full(len(touched), -1, dtype=np.int64)
                local[rows] = np.arange(len(rows))
                qmask = local[q_rows] >= 0
                qi = np.where(qmask)[0]
                r_loc = local[q_rows[qi]]
                off = q_off[qi]
                pos = np.where(off <= len1[r_loc], off, 1 + t1 + (off - len1[r_loc] - 1))
                q_h[torch.from_numpy(qi)] = h_all[torch.from_numpy(r_loc), torch.from_numpy(pos)]
                _set_rows(new_anchor, torch.from_numpy(rows), mid)
            t_last = torch.from_numpy(idx.last_time(q_nodes, q_m))
            z = self.model.node_readout(q_h, t_last, torch.from_numpy(q_t))
        else:
            new_anchor = None

        pair = ids = None
        if cfg.use_pair_features or cfg.identity_match_dim:
            lists = idx.neighbour_lists(
                q_nodes,
                q_m,
                cfg.neighbour_list_len,
                cfg.role_counts,
                cfg.transition_buckets,
                cfg.transition_decay,
                cfg.transition_order2,
                cfg.latest_transition_count and not cfg.latest_transition_at_query,
            )
            if cfg.latest_transition_at_query:
                assert isinstance(lists.transitions, PrefixTransitions)
                lists.transitions.latest_counts = self._latest_at_query(q_nodes, q_m, q_t)
            keys = torch.from_numpy(d.keys[q_nodes])
            m_t = torch.from_numpy(q_m)
            last = torch.from_numpy(idx.last_time(q_nodes, q_m))
            # Positives (u, v), then negatives (s, n): rows of the queries
            # [u..., v..., s..., n...].
            s0 = 2 * n_q
            a = torch.cat([torch.arange(n_q), torch.arange(s0, s0 + n_neg)])
            b = torch.cat([torch.arange(n_q, s0), torch.arange(s0 + n_neg, s0 + 2 * n_neg)])
            pair, ids = pair_inputs(
                cfg,
                keys[a],
                keys[b],
                torch.from_numpy(np.concatenate([t, neg_t])),
                lists.select(a),
                lists.select(b),
                m_t[a],
                m_t[b],
                last[a],
                last[b],
            )
        if z is not None:
            z_u, z_v = z[:n_q], z[n_q : 2 * n_q]
            z_s, z_n = z[2 * n_q : 2 * n_q + n_neg], z[2 * n_q + n_neg :]
            logits = self.model.head_logit(torch.cat([z_u, z_s]), torch.cat([z_v, z_n]), pair, ids)
        else:
            logits = self.model.head_logit(None, None, pair, ids)
        labels = torch.cat([torch.ones(n_q), torch.zeros(n_neg)])
        if self.positive_weight is None:
            loss = F.binary_cross_entropy_with_logits(logits, labels)
        else:
            loss = F.binary_cross_entropy_with_logits(
                logits, labels, pos_weight=self.positive_weight
            )

        self.last_batch = {
            "src": u,
            "dst": v,
            "neg_src": neg_src,
            "neg": neg_dst,
            "t": t,
            "neg_t": neg_t,
            "neg_rows": neg_rows,  # the position in the batch of each negative's positive
        }
        # The sources' read-outs at their events' times (exact visibility, with
        # gradients) and how many of their events they had seen: node-classification
        # fine-tuning (training/node_finetune.py) puts its loss on them.
        self.last_sources = (ev, None if z is None else z[:n_q], q_m[:n_q])
        # Commit the bookkeeping (anchors are detached copies).
        if new_anchor is not None:
            _set_rows(self.anchor, torch.from_numpy(touched), new_anchor)
        self.anchor_count[touched] = a_new
        self.done[touched] = end
        return loss, logits.detach().numpy(), labels.numpy()


# ===================================================================== resumable state
def _save_train_state(
    out: Path,
    model: DygMambaLinkModel,
    opt: torch.optim.Optimizer,
    average: WeightAverage | None,
    doc: dict[str, Any],
) -> None:
    st = out / TRAIN_STATE_DIR
    st.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().contiguous() for k, v in model.state_dict().items()},
        str(st / "model.safetensors"),
    )
    osd = opt.state_dict()
    tensors = {}
    for pid, pstate in osd["state"].items():
        for name, val in pstate.items():
            tensors[f"{pid}.{name}"] = val if torch.is_tensor(val) else torch.tensor(val)
    save_file(
        {k: v.detach().contiguous() for k, v in tensors.items()}, str(st / "optimizer.safetensors")
    )
    if average is not None:
        save_file(average.state(), str(st / "average.safetensors"))
    doc = {**doc, "param_groups": osd["param_groups"]}
    tmp = st / "state.json.tmp"
    tmp.write_text(json.dumps(jsonable(doc), indent=2, sort_keys=True) + "\n")
    tmp.replace(st / "state.json")


def _load_train_state(
    out: Path, model: DygMambaLinkModel, opt: torch.optim.Optimizer, average: WeightAverage | None
) -> dict[str, Any] | None:
    st = out / TRAIN_STATE_DIR
    if not (st / "state.json").exists():
        return None
    doc = json.loads((st / "state.json").read_text())
    model.load_state_dict(load_file(str(st / "model.safetensors")))
    flat = load_file(str(st / "optimizer.safetensors"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, val in flat.items():
        pid, _, name = key.partition(".")
        state.setdefault(int(pid), {})[name] = val
    opt.load_state_dict({"state": state, "param_groups": doc["param_groups"]})
    if average is not None:
        if not (st / "average.safetensors").exists():
            raise ValueError("cannot resume: the saved training state has no weight average")
        average.load(load_file(str(st / "average.safetensors")))
    return doc


def _snapshot(
    model: DygMambaLinkModel, opt: torch.optim.Optimizer, average: WeightAverage | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, torch.Tensor]]:
    averaged = {k: v.clone() for k, v in average.state().items()} if average is not None else {}
    return copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), averaged


# ===================================================================== train
def train(
    data_path: str | Path,
    out_dir: str | Path,
    config: dict[str, Any] | ModelConfig | None = None,
    epochs: int = DEFAULT_MAX_EPOCHS,
    batch_size: int = 200,
    lr: float = 1e-3,
    seed: int = 0,
    patience: int | None = None,
    max_events: int | None = None,
    visibility: str | None = None,
    resume: bool = False,
    window: int = 16,
    progress: bool = True,
    test_eval: bool = True,
    max_train_events: int | None = None,
    grad_clip: float = 1.0,
    historical_negatives: float | None = None,
    auto: bool = True,
    historical_extra: bool = False,
    select_on: str | None = None,
    plateau_lr_factor: float = 1.0,
    negatives_per_positive: int = 1,
    weight_average_decay: float = 0.0,
) -> str:
    """Train on ``data_path``; save the best-validation checkpoint to ``out_dir``; return its version.

    ``visibility``, ``select_on`` and ``patience`` None: chosen from the training split
    (``auto_config``; exact visibility, random negatives and ``DEFAULT_PATIENCE`` unless
    the stream comes in snapshots).

    ``plateau_lr_factor`` < 1: an epoch that does not beat the best validation score is
    undone (model and optimizer back to the best epoch's) and the learning rate is
    multiplied by it, so the next epochs take smaller steps from the best weights
    instead of drifting on from worse ones. 1: the weights go on from the last epoch at
    a constant rate. ``negatives_per_positive``: training negatives per positive, each
    from the same mix of random and historical ones. ``weight_average_decay`` > 0:
    validation and the checkpoint use an exponential moving average of the weights
    over the training steps (``training/weight_average.py``); 0: the last step's."""
    if not 0.0 < plateau_lr_factor <= 1.0:
        raise ValueError("plateau_lr_factor must be in (0, 1]")
    if visibility not in (None, "exact", "batch"):
        raise ValueError("visibility must be 'exact' or 'batch'")
    if select_on not in (None, *SELECTION_NEGATIVES):
        raise ValueError(f"select_on must be one of {sorted(SELECTION_NEGATIVES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    stream = read_edge_stream(data_path, limit=max_events)
    data = IndexedStream.build(stream)
    split = chronological_split(stream)
    train_events = np.where(split.train)[0]
    if max_train_events is not None and len(train_events) > max_train_events:
        # Reduced budget: the LAST max_train_events training events (closest to validation).
        train_events = train_events[-max_train_events:]
    index = NodeEventIndex.build(data, train_events)

    overrides = config.model_dump() if isinstance(config, ModelConfig) else dict(config or {})
    overrides.pop("time_norm", None)
    overrides.pop("edge_feature_dim", None)
    # Stream-dependent settings come from the training split's statistics (auto_config);
    # anything the caller set explicitly wins. A full ModelConfig is explicit throughout.
    profile = StreamProfile.of(data.src[train_events], data.dst[train_events], data.t[train_events])
    chosen = (
        choose_settings(profile, overrides, historical_negatives, visibility, select_on, patience)
        if auto and not isinstance(config, ModelConfig)
        else AutoSettings(
            historical_negatives=historical_negatives or 0.0,
            visibility=visibility or "exact",
            select_on=select_on or "random",
            patience=patience,
        )
    )
    patience = chosen.patience or DEFAULT_PATIENCE
    overrides = {**chosen.config, **overrides}
    historical_negatives = chosen.historical_negatives
    visibility = chosen.visibility
    selection = SELECTION_NEGATIVES[chosen.select_on]
    cfg = ModelConfig().with_updates(
        **overrides,
        edge_feature_dim=data.feature_dim,
        time_norm=fit_time_normalisation(training_gaps(index)).model_dump(),
    )
    model = DygMambaLinkModel(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    average = WeightAverage(model, weight_average_decay) if weight_average_decay else None

    history: list[dict[str, Any]] = []
    # "score": the validation AP the epochs are compared on (``select_on``).
    best = {"score": -math.inf, "epoch": -1}
    start_epoch = 0
    if resume:
        doc = _load_train_state(out, model, opt, average)
        if doc is not None:
            if doc.get("config") != jsonable(cfg.model_dump(mode="json")):
                raise ValueError("cannot resume: the saved training state has another model config")
            history, best, start_epoch = doc["history"], doc["best"], doc["epoch"] + 1
            best.setdefault("score", best.pop("ap", -math.inf))  # a state saved before select_on
            if doc.get("stopped"):
                start_epoch = epochs
    # the best epoch's model and optimizer, to go back to (plateau_lr_factor); a resumed
    # run holds them already: its saved state is the best epoch's or was restored to it
    best_state = _snapshot(model, opt, average) if plateau_lr_factor < 1.0 else None
    info = {
        "dataset": stream.name,
        "data": str(data_path),
        "events": len(data),
        "train_events": int(len(train_events)),
        "train_events_total": int(split.train.sum()),
        "val_events": int(split.val.sum()),
        "test_events": int(split.test.sum()),
        "visibility": visibility,
        "window": window,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "epochs": epochs,
        "patience": patience,
        "historical_negatives": historical_negatives,
        "historical_negatives_extra": historical_extra,
        "select_on": chosen.select_on,
        "plateau_lr_factor": plateau_lr_factor,
        "negatives_per_positive": negatives_per_positive,
        "weight_average_decay": weight_average_decay,
        "auto": chosen.as_json(profile),
        "max_events": max_events,
        "max_train_events": max_train_events,
        "torch_threads": torch.get_num_threads(),
    }
    bad_epochs = (len(history) - 1 - best["epoch"]) if (history and best["epoch"] >= 0) else 0
    stopped = False
    for epoch in range(start_epoch, epochs):
        if bad_epochs >= patience:
            stopped = True
            break
        model.train()
        rng = np.random.default_rng([seed, epoch])
        runner = EpochRunner(
            model,
            data,
            train_events,
            index,
            window,
            visibility,
            historical_negatives,
            historical_extra,
            negatives_per_positive,
        )
        t0 = time.perf_counter()
        losses, all_logits, all_labels = [], [], []
        batches = range(0, len(train_events), batch_size)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(batches, desc=f"epoch {epoch}", unit="batch", leave=False, mininterval=1.0)
        for i, b0 in enumerate(batches):
            b1 = min(b0 + batch_size, len(train_events))
            loss, logits, labels = runner.batch_loss(b0, b1, rng)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            if average is not None:
                average.update(model)
            losses.append(float(loss.detach()))
            all_logits.append(logits)
            all_labels.append(labels)
            if bar is not None:
                bar.update(1)
                if i % 10 == 0:
                    recent_y = np.concatenate(all_labels[-10:])
                    recent_s = np.concatenate(all_logits[-10:])
                    bar.set_postfix(
                        loss=f"{np.mean(losses[-10:]):.4f}",
                        ap=f"{average_precision(recent_y, recent_s):.4f}",
                    )
        if bar is not None:
            bar.close()
        train_time = time.perf_counter() - t0
        y, s = np.concatenate(all_labels), np.concatenate(all_logits)
        t1 = time.perf_counter()
        with average.applied(model) if average is not None else nullcontext():
            by_kind = validation_metrics(model, data, split, visibility, selection)
        val = by_kind["random"]
        score = float(np.mean([by_kind[kind]["ap"] for kind in selection]))
        eval_time = time.perf_counter() - t1
        row = {
            "epoch": epoch,
            "train_loss": float(np.mean(losses)),
            "train_ap": average_precision(y, s),
            "train_auc": roc_auc(y, s),
            "val_ap": val["ap"],
            "val_auc": val["auc"],
            "val_ap_global": val["ap_global"],
            **{f"val_ap_{kind}": by_kind[kind]["ap"] for kind in selection if kind != "random"},
            "val_score": score,
            "lr": opt.param_groups[0]["lr"],
            "epoch_time_s": train_time,
            "eval_time_s": eval_time,
        }
        history.append(row)
        # One line per epoch even without the bar: a log (make results, a scheduler's
        # job) then shows how far a run of tens of minutes is and where it stands.
        selected = f", selection score {score:.4f}" if len(selection) > 1 else ""
        print(
            f"epoch {epoch}: loss {row['train_loss']:.4f} train AP {row['train_ap']:.4f} "
            f"val AP {val['ap']:.4f} AUC {val['auc']:.4f}{selected} "
            f"({train_time:.1f}s train, {eval_time:.1f}s eval)",
            flush=True,
        )
        if score > best["score"] or best["epoch"] < 0:
            best = {"score": score, "epoch": epoch}
            bad_epochs = 0
            with average.applied(model) if average is not None else nullcontext():
                save_checkpoint(out, model, _metrics_doc(info, cfg, history, best, None))
            if best_state is not None:
                best_state = _snapshot(model, opt, average)
        else:
            bad_epochs += 1
            if best_state is not None:
                lr_now = opt.param_groups[0]["lr"]
                model.load_state_dict(best_state[0])
                opt.load_state_dict(best_state[1])
                if average is not None:
                    average.load(best_state[2])
                for group in opt.param_groups:
                    group["lr"] = lr_now * plateau_lr_factor
        _save_train_state(
            out,
            model,
            opt,
            average,
            {
                "epoch": epoch,
                "history": history,
                "best": best,
                "config": cfg.model_dump(mode="json"),
                "info": info,
            },
        )
    if stopped or bad_epochs >= patience:
        doc = json.loads((out / TRAIN_STATE_DIR / "state.json").read_text())
        doc["stopped"] = True
        (out / TRAIN_STATE_DIR / "state.json").write_text(
            json.dumps(doc, indent=2, sort_keys=True) + "\n"
        )

    # Reload the best epoch and finish its metrics (test with the streaming evaluator).
    ckpt = load_checkpoint(out)
    test = None
    if test_eval:
        m, _ = evaluate_model(
            ckpt.model, data, split, ("test",), ("transductive",), ("random",), 0, visibility
        )
        test = m["test"]["transductive"]["random"]
        print(
            f"best epoch {best['epoch']}: val score {best['score']:.4f}, test AP {test['ap']:.4f} AUC {test['auc']:.4f}"
        )
    return save_checkpoint(out, ckpt.model, _metrics_doc(info, ckpt.config, history, best, test))


def _metrics_doc(
    info: dict[str, Any],
    cfg: ModelConfig,
    history: list[dict[str, Any]],
    best: dict[str, Any],
    test: dict[str, Any] | None,
) -> dict[str, Any]:
    best_row = next((h for h in history if h["epoch"] == best["epoch"]), {})
    doc = {
        **info,
        "best_epoch": best["epoch"],
        "val": {
            "ap": best_row.get("val_ap"),
            "auc": best_row.get("val_auc"),
            "ap_global": best_row.get("val_ap_global"),
            "negatives": "random",
            "setting": "transductive",
            # What the best epoch was chosen on, and where it was more than random AP,
            # the other negatives' AP.
            "score": best_row.get("val_score"),
            **{
                key.removeprefix("val_"): value
                for key, value in best_row.items()
                if key in ("val_ap_historical", "val_ap_inductive")
            },
        },
        "test": None
        if test is None
        else {**test, "negatives": "random", "setting": "transductive"},
        "epoch_times_s": [h["epoch_time_s"] for h in history],
        "mean_epoch_time_s": float(np.mean([h["epoch_time_s"] for h in history]))
        if history
        else None,
        "history": history,
        "config": cfg.model_dump(mode="json"),
    }
    return jsonable(doc)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if asks_node_task(argv):  # a node-classification head: its own trainer
        # Named, not imported (as service/cli.py names its commands): the node trainer
        # builds on this module (fine-tuning reuses EpochRunner), so an import here
        # would be an import cycle.
        node_trainer = importlib.import_module("training.node_classification")
        return int(node_trainer.main(argv))
    ap = argparse.ArgumentParser(prog="dygserve train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="dataset folder or edges.csv.gz")
    ap.add_argument("--out", required=True, help="checkpoint folder to write")
    ap.add_argument(
        "--epochs",
        type=int,
        default=DEFAULT_MAX_EPOCHS,
        help="at most this many epochs; early stopping on validation AP ends most runs sooner",
    )
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--patience",
        type=int,
        default=None,
        help=f"stop after this many epochs without a better validation AP; default {DEFAULT_PATIENCE},"
        " or chosen from the training split (training/auto_config.py)",
    )
    ap.add_argument(
        "--max-events", type=int, default=None, help="only the first N events of the stream"
    )
    ap.add_argument(
        "--max-train-events",
        type=int,
        default=None,
        help="train on the last N training events only",
    )
    ap.add_argument(
        "--window",
        type=int,
        default=16,
        help="events re-scanned before each batch (gradient window)",
    )
    ap.add_argument(
        "--visibility",
        choices=("exact", "batch"),
        default=None,
        help="what a query sees of its own timestamp; default: chosen from the training split"
        " (training/auto_config.py: batch on snapshot streams, else exact)",
    )
    ap.add_argument(
        "--historical-negatives",
        type=float,
        default=None,
        help="share of training negatives that are past training edges (whole pairs);"
        " default: chosen from the training split (training/auto_config.py)",
    )
    ap.add_argument(
        "--historical-extra",
        action="store_true",
        help="historical training negatives come on top of each positive's random one"
        " instead of replacing it",
    )
    ap.add_argument(
        "--select-on",
        choices=sorted(SELECTION_NEGATIVES),
        default=None,
        help="the validation AP that picks the best epoch: random negatives, or the mean over"
        " random, historical and inductive ones; default: chosen from the training split"
        " (training/auto_config.py)",
    )
    ap.add_argument(
        "--no-auto",
        action="store_true",
        help="no settings from the stream's statistics: the ModelConfig defaults and --set only",
    )
    ap.add_argument(
        "--plateau-lr-factor",
        type=float,
        default=1.0,
        help="after an epoch without a better validation score, go back to the best epoch's"
        " weights and multiply the learning rate by this (1: keep going at a constant rate)",
    )
    ap.add_argument(
        "--negatives-per-positive",
        type=int,
        default=1,
        help="training negatives per positive, each drawn from the same mix of random and"
        " historical ones (the positives weighted to match)",
    )
    ap.add_argument(
        "--weight-average-decay",
        type=float,
        default=0.0,
        help="validate and keep an exponential moving average of the weights over the"
        " training steps with this decay (e.g. 0.995); 0: the last step's weights",
    )
    ap.add_argument("--resume", action="store_true", help="continue from OUT/train_state")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ModelConfig override, e.g. d_model=32",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--no-progress", action="store_true", help="no progress bar (one line per epoch stays)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    version = train(
        args.data,
        args.out,
        parse_overrides(args.set),
        args.epochs,
        args.batch_size,
        args.lr,
        args.seed,
        args.patience,
        args.max_events,
        args.visibility,
        args.resume,
        args.window,
        not args.no_progress,
        max_train_events=args.max_train_events,
        historical_negatives=args.historical_negatives,
        auto=not args.no_auto,
        historical_extra=args.historical_extra,
        select_on=args.select_on,
        plateau_lr_factor=args.plateau_lr_factor,
        negatives_per_positive=args.negatives_per_positive,
        weight_average_decay=args.weight_average_decay,
    )
    print(f"model version {version} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
