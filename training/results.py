"""Train and evaluate on the shared datasets and write docs/RESULTS.md.

    python -m training.results --data ../shared/data --out runs/results --doc docs/RESULTS.md
        [--datasets uci,canparl,uslegis,mooc,wikipedia] [--epochs N] [--max-train-events N]
        [--no-ablation | --variants full,state_only,features_only,...]
        [--no-baselines] [--mrr-k K]
        [--reuse] [--render-only]
    python -m training.results --node-classification [--datasets wikipedia,mooc]
        [--nc-base NAME=LINK_CHECKPOINT[,LINK_CHECKPOINT...] ...] [--nc-seeds 0,1,2]

Per dataset (folder ``OUT/<name>/``):

1. ``full/``: the default model (state + pair features), trained with early stopping on
   validation AP; evaluated with the streaming evaluator on validation and test,
   transductive and inductive, random / historical / inductive negatives, MRR.
2. baselines on the same queries: EdgeBank (unlimited memory) and "recompute" (each
   query re-scans both endpoints' last L events from the initial state).
3. ablation (same budget, the first seed; ``VARIANTS``): ``state_only/``
   (use_pair_features=False), ``features_only/`` (use_state=False), ``linear_time/``
   (the linear time encoder alone), and each setting the trainer turned on for the
   stream taken away again: ``no_transitions/``, ``no_transition_decay/``,
   ``no_transition_order2/``, ``no_latest_transition/``, ``no_role_counts/``, ``no_identity_match/``; evaluated on test (transductive, all
   negatives).

Each step writes ``summary.json`` (each further seed as it finishes); ``--reuse`` skips
steps whose outputs exist, and where ``runs/`` is gone it starts from the kept summary
below, so that a later session can add seeds to a stream without training its rows
again (a step that needs a checkpoint no longer there, such as the baselines, then has
to come from that summary too). The document is rendered from whatever summaries exist (``--render-only``), so long
runs can be done piecemeal. A copy of each dataset's summary is kept beside the
document (``--summaries``, by default ``docs/results/summaries/<dataset>.json``, which is
committed): a full run takes longer than a working session on a 2-core machine, so the
streams can be run in different sessions, each run rendering every stream that has a
summary, here or kept. Only the link-prediction part of the document is rewritten;
everything from the node-classification section on is kept as it is.

The per-dataset budgets are in ``BUDGETS`` (with any model
settings a dataset departs from the defaults with, under ``config``); a row trained
on fewer epochs or fewer training events than the full protocol is marked "reduced".

Then, on the labelled streams (Wikipedia, MOOC), a node-classification head on each
fresh link checkpoint (``training/node_results.py``: its own section of the document;
``--node-classification`` runs and rewrites only that section).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.checkpoint import load_checkpoint

from . import node_results
from .baselines import recompute, run_baselines
from .evaluate import evaluate_model, load_data, trained_visibility
from .jsonable import jsonable
from .machine import describe_machine
from .negatives import STRATEGIES
from .train import DEFAULT_MAX_EPOCHS, TRAIN_STATE_DIR, train

# Paper (DyG-Mamba v1, Table 4): transductive AP, mean ± std over 5 runs.
PAPER_TABLE4 = {
    "wikipedia": {
        "rnd": {
            "JODIE": "96.50±0.14",
            "TGN": "98.45±0.06",
            "DyGFormer": "99.03±0.02",
            "DyG-Mamba": "99.08±0.09",
            "EdgeBank": "90.37±0.00",
        },
        "hist": {
            "JODIE": "83.01±0.66",
            "TGN": "86.86±0.33",
            "DyGFormer": "82.23±2.54",
            "DyG-Mamba": "82.35±1.25",
            "EdgeBank": "73.35±0.00",
        },
        "ind": {
            "JODIE": "75.65±0.79",
            "TGN": "85.62±0.44",
            "DyGFormer": "78.29±5.38",
            "DyG-Mamba": "87.06±0.86",
            "EdgeBank": "80.63±0.00",
        },
    },
    "mooc": {
        "rnd": {
            "JODIE": "80.23±2.44",
            "TGN": "89.15±1.60",
            "DyGFormer": "87.52±0.49",
            "DyG-Mamba": "90.25±0.09",
            "EdgeBank": "57.97±0.00",
        },
        "hist": {
            "JODIE": "78.94±1.25",
            "TGN": "87.06±1.93",
            "DyGFormer": "85.85±0.66",
            "DyG-Mamba": "87.42±1.57",
            "EdgeBank": "60.71±0.00",
        },
        "ind": {
            "JODIE": "65.23±2.19",
            "TGN": "77.50±2.91",
            "DyGFormer": "81.24±0.69",
            "DyG-Mamba": "81.19±2.02",
            "EdgeBank": "49.43±0.00",
        },
    },
    "uci": {
        "rnd": {
            "JODIE": "89.43±1.09",
            "TGN": "92.34±1.04",
            "DyGFormer": "95.79±0.17",
            "DyG-Mamba": "96.14±0.14",
            "EdgeBank": "76.20±0.00",
        },
        "hist": {
            "JODIE": "75.24±5.80",
            "TGN": "80.43±2.12",
            "DyGFormer": "82.17±0.82",
            "DyG-Mamba": "81.36±0.14",
            "EdgeBank": "65.50±0.00",
        },
        "ind": {
            "JODIE": "65.99±1.40",
            "TGN": "70.94±0.71",
            "DyGFormer": "72.25±1.71",
            "DyG-Mamba": "77.75±1.56",
            "EdgeBank": "57.43±0.00",
        },
    },
    "canparl": {
        "rnd": {
            "JODIE": "69.26±0.31",
            "TGN": "70.88±2.34",
            "DyGFormer": "97.36±0.45",
            "DyG-Mamba": "98.20±0.52",
            "EdgeBank": "64.55±0.00",
        },
        "hist": {
            "JODIE": "51.79±0.63",
            "TGN": "68.42±3.07",
            "DyGFormer": "97.00±0.31",
            "DyG-Mamba": "97.39±0.29",
            "EdgeBank": "63.84±0.00",
        },
        "ind": {
            "JODIE": "48.42±0.66",
            "TGN": "65.34±2.87",
            "DyGFormer": "95.44±0.57",
            "DyG-Mamba": "97.29±0.96",
            "EdgeBank": "62.16±0.00",
        },
    },
    "uslegis": {
        "rnd": {
            "JODIE": "75.05±1.52",
            "TGN": "75.99±0.58",
            "DyGFormer": "71.11±0.59",
            "DyG-Mamba": "73.66±1.13",
            "EdgeBank": "58.39±0.00",
        },
        "hist": {
            "JODIE": "51.71±5.76",
            "TGN": "74.00±7.57",
            "DyGFormer": "85.30±3.88",
            "DyG-Mamba": "88.86±1.40",
            "EdgeBank": "63.22±0.00",
        },
        "ind": {
            "JODIE": "50.27±5.13",
            "TGN": "67.57±6.47",
            "DyGFormer": "81.25±3.62",
            "DyG-Mamba": "85.61±1.66",
            "EdgeBank": "64.74±0.00",
        },
    },
}
PAPER_MODELS = ("JODIE", "TGN", "DyGFormer", "DyG-Mamba")
# The best published test AP per cell (transductive; DyGLib protocol), the goal of the
# default command: TPNet (NeurIPS 2024, Tables 1, 7, 9) or DyG-Mamba (arXiv 2408.06966v2,
# Table 2), or an older model that beats both in the same table
# (../shared/reference/anchors-sota.md).
BEST_PUBLISHED: dict[str, dict[str, tuple[float, str]]] = {
    "uci": {"rnd": (97.35, "TPNet"), "hist": (93.96, "PINT"), "ind": (83.61, "PINT")},
    "canparl": {
        "rnd": (98.37, "DyG-Mamba"),
        "hist": (97.22, "DyG-Mamba"),
        "ind": (96.58, "DyG-Mamba"),
    },
    "uslegis": {"rnd": (80.58, "TPNet"), "hist": (94.55, "TPNet"), "ind": (91.05, "TPNet")},
    "wikipedia": {"rnd": (99.32, "TPNet"), "hist": (91.33, "PINT"), "ind": (88.59, "GraphMixer")},
    "mooc": {"rnd": (96.39, "TPNet"), "hist": (92.69, "TPNet"), "ind": (88.18, "TPNet")},
}
NAMES = {
    "uci": "UCI",
    "canparl": "Can. Parl.",
    "uslegis": "US Legis.",
    "mooc": "MOOC",
    "wikipedia": "Wikipedia",
}
SHORT = {"random": "rnd", "historical": "hist", "inductive": "ind"}

# Full protocol would be 100 epochs / patience 20 (paper); these fit 2 shared CPU cores.
# Every dataset runs the default command (``dygserve train --data X``): at most
# DEFAULT_MAX_EPOCHS epochs with early stopping, and the stream-dependent settings chosen
# by the trainer from the training split (``training.auto_config``). Only the MRR
# negatives per positive differ (K = 5 on the bipartite streams, whose destination
# sides are small).
_DEFAULT_BUDGET: dict[str, Any] = {
    "epochs": DEFAULT_MAX_EPOCHS,
    "patience": None,  # the trainer's: DEFAULT_PATIENCE, or its snapshot rule's
    "max_train_events": None,
    "mrr_k": 20,
}
BUDGETS: dict[str, dict[str, Any]] = {
    "uci": dict(_DEFAULT_BUDGET),
    "canparl": dict(_DEFAULT_BUDGET),
    "uslegis": dict(_DEFAULT_BUDGET),
    "wikipedia": {**_DEFAULT_BUDGET, "mrr_k": 5},
    "mooc": {**_DEFAULT_BUDGET, "mrr_k": 5},
}
FULL_PROTOCOL_EPOCHS = 100


@dataclass(frozen=True)
class Variant:
    """A row of the ablation table: the full model's config with ``change`` (a function
    of the config the trainer chose for the full model), trained where ``applies`` says
    the trainer turned on what the row takes away."""

    label: str
    change: Callable[[dict[str, Any]], dict[str, Any]] = lambda full: {}
    applies: Callable[[dict[str, Any]], bool] = lambda full: True


VARIANTS: dict[str, Variant] = {
    "full": Variant("state + pair features (default)"),
    "state_only": Variant(
        "SSM state only (use_pair_features=False)",
        lambda full: {"use_pair_features": False, "identity_match_dim": 0},
    ),
    "features_only": Variant(
        "pair/activity features only (use_state=False)", lambda full: {"use_state": False}
    ),
    "no_transitions": Variant(
        "without transition counts (transition_buckets=0)",
        lambda full: {
            "transition_buckets": 0,
            "transition_decay": 0.0,
            "transition_order2": False,
            "latest_transition_count": False,
            "latest_transition_at_query": False,
        },
        lambda full: bool(full.get("transition_buckets")),
    ),
    "no_transition_decay": Variant(
        "transition counts not decayed (transition_decay=0)",
        lambda full: {"transition_decay": 0.0},
        lambda full: bool(full.get("transition_decay")),
    ),
    "no_transition_order2": Variant(
        "first-order transition counts only (transition_order2=false)",
        lambda full: {"transition_order2": False},
        lambda full: bool(full.get("transition_order2")),
    ),
    "no_latest_transition": Variant(
        "without the latest transition count read at the query (latest_transition_count=false)",
        lambda full: {"latest_transition_count": False, "latest_transition_at_query": False},
        lambda full: bool(full.get("latest_transition_count")),
    ),
    "no_role_counts": Variant(
        "without role counts (role_counts=false)",
        lambda full: {"role_counts": False},
        lambda full: bool(full.get("role_counts")),
    ),
    # The identity match added back where the trainer chose lists of 128 for a small
    # item side in continuous time (the streams it was a default on until 2026-11-28).
    "identity_match": Variant(
        "with the identity match (identity_match_dim=128, identity_match_depth=3)",
        lambda full: {"identity_match_dim": 128, "identity_match_depth": 3},
        lambda full: (
            not full.get("identity_match_dim")
            and full.get("neighbour_list_len") == 128
            and bool(full.get("transition_decay"))
        ),
    ),
    # (the identity match comes with lists of 128: the row keeps the full model's lists)
    "no_identity_match": Variant(
        "without the identity match (identity_match_dim=0)",
        lambda full: {
            "identity_match_dim": 0,
            "neighbour_list_len": full.get("neighbour_list_len", 32),
        },
        lambda full: bool(full.get("identity_match_dim")),
    ),
    # Seed 004's lever: the affine encoder of the log-gap alone, without the sinusoids.
    "linear_time": Variant(
        "linear time encoder only (time_encoder=linear)",
        lambda full: {"time_encoder": "linear"},
        lambda full: full.get("time_encoder", "both") != "linear",
    ),
}


def _log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def run_dataset(
    name: str,
    data_root: Path,
    out_root: Path,
    budget: dict[str, Any],
    wanted: Sequence[str],
    baselines: bool,
    reuse: bool,
    seeds: Sequence[int] = (0,),
    kept: Path | None = None,
) -> dict[str, Any]:
    data_path = data_root / name / "edges.csv.gz"
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    kept_path = kept / f"{name}.json" if kept is not None else None
    from_kept = reuse and not summary_path.exists() and kept_path is not None and kept_path.exists()
    source = kept_path if from_kept else summary_path
    summary: dict[str, Any] = (
        json.loads(source.read_text()) if (reuse and source is not None and source.exists()) else {}
    )
    if from_kept:
        _log(f"{name}: reusing the kept summary {kept_path} (its rows' checkpoints are gone)")
    summary.update({"dataset": name, "budget": budget})
    if not (reuse and "full" in summary.get("variants", {})):
        # The stream's machine is the full model's: rows added later to a kept summary
        # (ablations, on another day's VM) record their own in their row.
        summary["machine"] = describe_machine()

    def save() -> None:
        text = json.dumps(jsonable(summary), indent=2, sort_keys=True) + "\n"
        summary_path.write_text(text)
        if kept is not None:  # the copy that outlives runs/ (see the module's docstring)
            kept.mkdir(parents=True, exist_ok=True)
            (kept / f"{name}.json").write_text(text)

    data, split = load_data(data_path)
    kw = dict(
        epochs=budget["epochs"],
        patience=budget["patience"],
        max_train_events=budget["max_train_events"],
        progress=False,
        seed=seeds[0],
    )
    base = budget.get("config", {})
    for variant in wanted:
        vdir = out / variant
        full_config = _get(summary, "variants", "full", "train", "config") or {}
        spec = VARIANTS[variant]
        if variant != "full" and not spec.applies(full_config):
            continue  # the trainer did not turn on what this row takes away
        cfg = {**base, **spec.change(full_config)}
        done = variant in summary.get("variants", {})
        # (a row in the summary is done even where its checkpoint is gone: it may have
        # come from the kept summary, in this run or in an earlier one)
        if not (reuse and done):
            _log(f"{name}/{variant}: training ({budget})")
            t0 = time.perf_counter()
            train(data_path, vdir, cfg, test_eval=False, **kw)
            train_wall = time.perf_counter() - t0
            ckpt = load_checkpoint(vdir)
            _log(f"{name}/{variant}: evaluating")
            if variant == "full":
                metrics, _ = evaluate_model(
                    ckpt.model,
                    data,
                    split,
                    ("val", "test"),
                    ("transductive", "inductive"),
                    STRATEGIES,
                    budget["mrr_k"],
                    trained_visibility(ckpt.metrics),
                )
            else:
                metrics = _test_metrics(ckpt, data, split)
            summary.setdefault("variants", {})[variant] = {
                "version": ckpt.version,
                "train": ckpt.metrics,
                "eval": metrics,
                "train_wall_s": train_wall,
                "machine": describe_machine(),
            }
            save()
    if "full" in wanted:
        _run_more_seeds(
            name, data_path, out, budget, dict(base), seeds, summary, reuse, data, split, save
        )
    wants_baselines = baselines and not (reuse and "baselines" in summary)
    if wants_baselines and not (out / "full").exists():
        # A stream resumed from its kept summary: seed 0's checkpoint, which the baselines
        # read, went with runs/. Skip them (the row says "–") rather than lose the render.
        _log(f"{name}: baselines skipped: seed 0's checkpoint {out / 'full'} is gone")
    elif wants_baselines:
        _log(f"{name}: baselines")
        ckpt = load_checkpoint(out / "full")
        visibility = trained_visibility(ckpt.metrics)  # the cached row's
        summary["baselines"] = run_baselines(
            ckpt.model, data, split, ("test",), recompute_window=32, mrr_k=0, visibility=visibility
        )
        if ckpt.config.use_state:
            summary["baselines"]["recompute_L8"] = recompute(
                ckpt.model, data, split, ("test",), 8, visibility=visibility
            )
        save()
    summary["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    save()
    return summary


def _run_more_seeds(
    name: str,
    data_path: Path,
    out: Path,
    budget: dict[str, Any],
    cfg: dict[str, Any],
    seeds: Sequence[int],
    summary: dict[str, Any],
    reuse: bool,
    data: Any,
    split: Any,
    save: Callable[[], None],
) -> None:
    """The full model again with each further seed (``full-seed<k>``; the first seed is
    the ``full`` row itself), test AP with the three negative kinds per seed, and their
    mean and standard deviation in ``summary["seed_stats"]``, saved after each seed (a
    seed takes up to an hour here: a stop loses only the one in progress)."""
    full = summary["variants"]["full"]
    per_seed = full.setdefault("seeds", {})
    per_seed[str(seeds[0])] = _test_aps(full["eval"])
    for seed in seeds[1:]:
        if reuse and str(seed) in per_seed:
            continue
        sdir = out / f"full-seed{seed}"
        _log(f"{name}/full seed {seed}: training")
        _train_or_resume(
            reuse,
            data_path,
            sdir,
            dict(cfg),
            epochs=budget["epochs"],
            patience=budget["patience"],
            max_train_events=budget["max_train_events"],
            progress=False,
            test_eval=False,
            seed=seed,
        )
        per_seed[str(seed)] = _test_aps(_test_metrics(load_checkpoint(sdir), data, split))
        _seed_stats(summary, per_seed)
        save()
    _seed_stats(summary, per_seed)
    save()


def _train_or_resume(
    reuse: bool, data_path: Path, out: Path, cfg: dict[str, Any], **kw: Any
) -> None:
    """``train``; with ``--reuse``, resumed from ``out``'s saved training state where one
    of the same settings is there (a seed cut off by a stop goes on where it was; one
    that finished, also one trained beside this run with ``dygserve train --out``, is
    only reloaded), else trained afresh."""
    if reuse and (out / TRAIN_STATE_DIR / "state.json").exists():
        try:
            train(data_path, out, cfg, resume=True, **kw)
            return
        except ValueError as e:  # another run's settings: start again
            if not str(e).startswith("cannot resume"):
                raise
            _log(f"{out}: not resumed ({e}); training afresh")
    train(data_path, out, cfg, **kw)


def _seed_stats(summary: dict[str, Any], per_seed: dict[str, dict[str, float]]) -> None:
    summary["seed_stats"] = {
        strat: {
            "mean": float(np.mean([r[strat] for r in per_seed.values()])),
            "std": float(np.std([r[strat] for r in per_seed.values()])),
            "n": len(per_seed),
        }
        for strat in STRATEGIES
    }


def _test_metrics(ckpt: Any, data: Any, split: Any) -> dict[str, Any]:
    """Test AP of a checkpoint, transductive, every negative kind, replayed with the
    visibility it was trained with (the ablation rows and the further seeds)."""
    metrics, _ = evaluate_model(
        ckpt.model,
        data,
        split,
        ("test",),
        ("transductive",),
        STRATEGIES,
        0,
        trained_visibility(ckpt.metrics),
    )
    return metrics


def _test_aps(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        strat: float(_get(metrics, "test", "transductive", strat, "ap")) for strat in STRATEGIES
    }


# ===================================================================== rendering
def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * float(x):.2f}"


def _best_paper_mean(row: dict[str, str]) -> float:
    """The highest mean among a row's published cells ("97.36±0.45"; -inf where none)."""
    means = [float(v.split("±")[0]) for v in row.values() if v and v[0].isdigit()]
    return max(means, default=float("-inf"))


def _cpu_of(row: dict[str, Any], summary: dict[str, Any]) -> str:
    """The CPU a row ran on: its own record, else the stream's (rows from before rows
    kept their own ran with the stream's full model)."""
    machine = row.get("machine") or summary.get("machine") or {}
    return str(machine.get("cpu") or "–")


def _secs(x: Any) -> str:
    return "–" if x is None else f"{float(x):.0f}"


def _int(x: Any) -> str:
    return "–" if x is None else f"{int(x):,}"


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _reduced(s: dict[str, Any]) -> str:
    b = s.get("budget", {})
    tr = _get(s, "variants", "full", "train") or {}
    bits = [f"{len(tr.get('history', []))} epoch(s)"]
    if tr.get("visibility") == "batch":
        bits.append("batch visibility")
    if b.get("max_train_events"):
        total = tr.get("train_events_total", tr.get("train_events", 0))
        if tr.get("train_events", 0) < total:
            bits.append(f"last {tr['train_events']:,} of {total:,} train events")
    return ", ".join(bits)


def render(
    summaries: list[dict[str, Any]], doc: Path, out_root: Path, missing: Sequence[str] = ()
) -> None:
    """Write the link-prediction part of ``doc`` from ``summaries``; whatever ``doc``
    already holds from the node-classification section on is kept."""
    L: list[str] = []
    w = L.append
    w("# Results: causal streaming DyG-Mamba (dygserve) vs the paper\n")
    w(
        "Generated by `make results` (`python -m training.results`), one stream at a time; each stream's "
        f"summary is kept in `docs/results/summaries/<dataset>.json` (this run's raw outputs: `{out_root}/`). "
        "When and where each stream ran:\n"
    )
    for s in summaries:
        m = s.get("machine") or {}
        where = ", ".join(
            str(x)
            for x in (m.get("cpu"), m.get("cores") and f"{m['cores']} cores", m.get("torch"))
            if x
        )
        w(
            f"- {NAMES.get(s['dataset'], s['dataset'])}: finished {s.get('finished', '–')}"
            + (f" ({where}, 1 torch thread per run)" if where else "")
        )
    if missing:
        w(
            "- not run with today's trainer yet: "
            + ", ".join(NAMES.get(n, n) for n in missing)
            + ". Their latest default-command figures, with each run's command and checkpoint, are in "
            "[`docs/results/current-defaults.md`](results/current-defaults.md)."
        )
    w("")
    w(
        "Every number of ours comes from the **streaming evaluator** (`training/evaluate.py`, on `training/replay.py`): the stream is replayed in time "
        "order, the queries of each timestamp are scored from the cached per-node states and recent-neighbour lists "
        "(`streaming.score`), then that timestamp's events are ingested (`streaming.advance`) -- the same two functions, "
        "hence the same numbers, as the HTTP service. The first table gives the mean ± std over the seeds run; the "
        "tables after it are the first seed's model. The paper reports the mean ± std of 5 seeds.\n"
    )
    w(
        "**Budgets.** The paper trains 100 epochs with patience 20. Ours: the default command's budget, at most "
        f"{DEFAULT_MAX_EPOCHS} epochs with early stopping on validation AP (patience 5; 10 on dense snapshot "
        "streams; fewer, down to 3, where 5 epochs would exceed 500,000 training events). The budget column gives the epochs each row ran.\n"
    )

    w("## Against the best published (test AP, transductive, default command)\n")
    w(
        "Ours: `dygserve train --data X` with no dataset flags (settings the trainer chose from the training "
        "split: `auto` in each checkpoint's metrics.json), mean ± standard deviation over the seeds run "
        "(n in brackets); **bold** where the mean reaches the goal, the best published number of the cell. "
        "On snapshot streams (Can. Parl., "
        "US Legis.: thousands of events per timestamp) the trainer picks batch visibility and the row is "
        "evaluated with it, as DyGLib evaluates TGN, JODIE and TPNet (a query sees the earlier batches of "
        "its own timestamp); DyGFormer and DyG-Mamba are evaluated with exact visibility. What was tried on "
        "each cell below its goal: [`docs/results/current-defaults.md`](results/current-defaults.md), "
        '"What is left, by cell".\n'
    )
    w("| dataset | rnd ours / best | hist ours / best | ind ours / best |")
    w("|---|---|---|---|")
    for s in summaries:
        best = BEST_PUBLISHED.get(s["dataset"])
        if not best:
            continue
        cells = [NAMES.get(s["dataset"], s["dataset"])]
        for strat in STRATEGIES:
            stat = _get(s, "seed_stats", strat)
            if stat and stat["n"] > 1:
                ours = f"{100 * stat['mean']:.2f} ± {100 * stat['std']:.2f} ({stat['n']})"
            elif stat:  # one seed: no spread to give
                ours = f"{100 * stat['mean']:.2f} (1)"
            else:
                ours = _pct(
                    _get(s, "variants", "full", "eval", "test", "transductive", strat, "ap")
                )
            goal, who = best[SHORT[strat]]
            mean = (
                stat["mean"]
                if stat
                else _get(s, "variants", "full", "eval", "test", "transductive", strat, "ap")
            )
            if mean is not None and 100 * float(mean) >= goal:
                ours = f"**{ours}**"
            cells.append(f"{ours} / {goal:.2f} {who}")
        w("| " + " | ".join(cells) + " |")
    w("")
    L.extend(_goal_lines(summaries))
    w("")
    w("## Transductive AP (test), random / historical / inductive negatives\n")
    w(
        "The paper's models (DyG-Mamba v1, Table 4: mean ± std of 5 runs) and ours (the first "
        "seed); ours is **bold** where it is above every paper mean of its row.\n"
    )
    w(
        "| dataset | NSS | JODIE | TGN | DyGFormer | DyG-Mamba | EdgeBank (paper) | EdgeBank (ours, same queries) | ours | budget |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        name = s["dataset"]
        for strat in STRATEGIES:
            p = PAPER_TABLE4.get(name, {}).get(SHORT[strat], {})
            ours = _get(s, "variants", "full", "eval", "test", "transductive", strat, "ap")
            eb = _get(s, "baselines", "edgebank", "test", "transductive", strat, "ap")
            cell = _pct(ours)
            if ours is not None and 100 * float(ours) > _best_paper_mean(p):
                cell = f"**{cell}**"
            w(
                f"| {NAMES.get(name, name)} | {SHORT[strat]} | "
                + " | ".join(p.get(m, "–") for m in PAPER_MODELS)
                + f" | {p.get('EdgeBank', '–')} | {_pct(eb)} | {cell} | {_reduced(s)} |"
            )
    w("")
    w("## Ours in more detail (test)\n")
    w(
        "AP averaged over DyGLib evaluation batches of 200 positives (global AP in brackets), AUC-ROC likewise; MRR "
        "of each positive against K random destinations (TGB-style rank, ties counted half).\n"
    )
    w(
        "| dataset | setting | rnd AP (global) | rnd AUC | hist AP | hist AUC | ind AP | ind AUC | MRR (K) | val AP rnd |"
    )
    w("|---|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        ev = _get(s, "variants", "full", "eval") or {}
        for setting in ("transductive", "inductive"):
            r = _get(ev, "test", setting) or {}
            mr = _get(ev, "test", "mrr") if setting == "transductive" else None
            row = [NAMES.get(s["dataset"], s["dataset"]), setting]
            row.append(f"{_pct(_get(r, 'random', 'ap'))} ({_pct(_get(r, 'random', 'ap_global'))})")
            row.append(_pct(_get(r, "random", "auc")))
            for strat in ("historical", "inductive"):
                row += [_pct(_get(r, strat, "ap")), _pct(_get(r, strat, "auc"))]
            row.append(f"{mr['mrr']:.4f} ({mr['k']})" if mr else "–")
            row.append(_pct(_get(ev, "val", setting, "random", "ap")))
            w("| " + " | ".join(row) + " |")
    w("")
    w("## Cached streaming states vs recompute-from-scratch (the paper's way of serving)\n")
    w(
        "Same weights, same queries (test, transductive, random negatives), same head and pair features; only the node "
        "states differ: *cached* = the state carried over the node's whole history (what the service keeps), "
        "*recompute* = both endpoints' last L events re-scanned from the initial state for every query.\n"
    )
    w(
        "| dataset | cached AP | recompute AP, L=32 | gap (cached - L=32) | recompute AP, L=8 | gap (cached - L=8) | L=32 replay time |"
    )
    w("|---|---|---|---|---|---|---|")
    for s in summaries:
        c = _get(s, "variants", "full", "eval", "test", "transductive", "random", "ap")
        cells = [NAMES.get(s["dataset"], s["dataset"]), _pct(c)]
        for key in ("recompute", "recompute_L8"):
            r = _get(s, "baselines", key, "test", "transductive", "random", "ap")
            cells += [_pct(r), "–" if c is None or r is None else f"{100 * (c - r):+.2f}"]
        cells.append(f"{_secs(_get(s, 'baselines', 'recompute', 'replay_seconds'))} s")
        w("| " + " | ".join(cells) + " |")
    w("")
    w("## Ablation (same budget; test, transductive AP)\n")
    w(
        "Each row is one training of the first seed with the full model's settings less what the "
        "row names, evaluated as the full model is; s / epoch is on the CPU named in the row "
        "(rows added on another day may have run on another VM).\n"
    )
    w("| dataset | variant | rnd | hist | ind | epochs | s / epoch | CPU |")
    w("|---|---|---|---|---|---|---|---|")
    labels = {name: spec.label for name, spec in VARIANTS.items()}
    for s in summaries:
        for variant in labels:
            v = _get(s, "variants", variant)
            if not v:
                continue
            r = _get(v, "eval", "test", "transductive") or {}
            tr = v.get("train", {})
            ept = tr.get("mean_epoch_time_s")
            cfg = tr.get("config", {})
            label = labels[variant]
            if cfg.get("identity_match_dim") and variant != "identity_match":
                label += f" + identity match (width {cfg['identity_match_dim']}, depth {cfg.get('identity_match_depth', 1)})"
            w(
                f"| {NAMES.get(s['dataset'], s['dataset'])} | {label} | {_pct(_get(r, 'random', 'ap'))} | "
                f"{_pct(_get(r, 'historical', 'ap'))} | {_pct(_get(r, 'inductive', 'ap'))} | {len(tr.get('history', []))} | "
                f"{_secs(ept)} | {_cpu_of(v, s)} |"
            )
    w("")
    w("## Training and evaluation cost on this CPU\n")
    w(
        "| dataset | events | train events used | epochs run (best) | train s / epoch | validation replay s / epoch | full evaluation replay s |"
    )
    w("|---|---|---|---|---|---|---|")
    for s in summaries:
        v = _get(s, "variants", "full") or {}
        tr = v.get("train", {})
        hist = tr.get("history", [])
        ev_s = _get(v, "eval", "replay_seconds")
        val_s = sum(h.get("eval_time_s", 0) for h in hist) / len(hist) if hist else None
        ept = tr.get("mean_epoch_time_s")
        cells = [
            NAMES.get(s["dataset"], s["dataset"]),
            _int(tr.get("events")),
            _int(tr.get("train_events")),
            f"{len(hist)} ({tr.get('best_epoch', '–')})",
            _secs(ept),
            _secs(val_s),
            _secs(ev_s),
        ]
        w("| " + " | ".join(cells) + " |")
    w("")
    w(FINDINGS)
    w(DIFFERENCES)
    text = "\n".join(L) + "\n"
    old_text = doc.read_text() if doc.exists() else ""
    if node_results.BEGIN in old_text:  # its own generator, and notes written by hand
        text += "\n" + node_results.BEGIN + old_text.split(node_results.BEGIN, 1)[1]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


FINDINGS = """## What the numbers say

- **Against the goal.** The lines under the first table say, per stream, which cells
  reach the best published number and how far the others are; where a cell is below it,
  `docs/results/current-defaults.md` ("What is left, by cell") lists what was tried on it
  and what each lever did, and the streams' experiment notes (`docs/results/*.md`) hold
  the runs.
- **Pair features vs state (ablation).** The pair/activity features carry most of the
  random-negative AP on the continuous-time streams, while the SSM state is what carries
  the *historical* and *inductive* negatives: those are built from pairs seen before,
  exactly the "seen before" signal that the pair features give, and the state encodes each
  node's recent activity and when a pair recurs.
- **Cached state vs recompute.** Scoring from the cached state is what the service does;
  the recompute columns re-scan both endpoints' last L events from the initial state for
  every query (the paper's way of serving), replayed with the same visibility as the
  cached row (batch visibility on snapshot streams). Where the two are level, the state
  forgets what lies beyond the last L events and the cache's gain is speed: recompute
  costs an O(L) scan per endpoint per query, the cache one step per event. Where the
  cached AP is higher, older history still carries signal and the cached state keeps it.
- **EdgeBank on our queries** remembers every edge strictly before the query time rather
  than before the evaluation batch (the paper's column), so it is higher on random
  negatives and below 50 on historical / inductive ones, which by construction are all
  remembered edges.
"""


def _goal_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """One line per stream: the cells at or above the best published, and the gap of
    the others (seed means where several seeds ran)."""
    lines = []
    for s in summaries:
        best = BEST_PUBLISHED.get(s["dataset"])
        if not best:
            continue
        met, gaps = [], []
        for strat in STRATEGIES:
            stat = _get(s, "seed_stats", strat)
            ours = (
                stat["mean"]
                if stat
                else _get(s, "variants", "full", "eval", "test", "transductive", strat, "ap")
            )
            if ours is None:
                continue
            goal, who = best[SHORT[strat]]
            gap = goal - 100 * float(ours)
            if gap <= 0:
                met.append(SHORT[strat])
            else:
                gaps.append(f"{SHORT[strat]} {gap:.2f} below {who} ({goal:.2f})")
        verdict = f"meets the goal on {', '.join(met)}" if met else "meets no goal"
        lines.append(
            f"- **{NAMES.get(s['dataset'], s['dataset'])}** {verdict}"
            + (f"; {'; '.join(gaps)}." if gaps else ".")
        )
    return lines


DIFFERENCES = """## How our setting differs from the paper's

- **Causal, per-node state, trained as served.** The paper re-encodes both endpoints' last L events for every
  query, normalises time by the query time, mixes pair co-occurrence counts into every token and cross-attends the
  two sequences. Our model keeps one SSM state per node (updated one event at a time, never re-encoded), decays it
  to the query time, and brings the pair signal back through 11 pair/activity features computed from each
  node's latest L (neighbour, time) entries (L = 32, or 128 where the trainer lengthens the lists), plus the
  snapshot, role-count or transition features where the trainer adds them (`model/pair_features.py`). It is much
  smaller (d_model 32, 1 layer, d_state 16: ~73 k parameters before the hashed-id tables) than the paper's (2 blocks, d = 50-200, d_out 172).
- **What the trainer adds, by stream** (`training/auto_config.py`, its reasons in each checkpoint's
  `metrics.json` under `auto`): historical training negatives where pairs recur; on bipartite streams with a
  small item side, lists of 128 (the identity match, learned embeddings of hashed node ids, is no longer
  chosen: beside the transition counts it only memorised; its ablation row adds it back); on
  every bipartite stream, per-node transition counts (which item follows which; in continuous time also
  decayed over a twentieth of the training span, and kept a second time for the two items before); on
  snapshot streams, batch visibility, lists that hold a snapshot, snapshot pair features, per-node role
  counts and the transition counts. Each one's ablation row and measurements are in `docs/results/`.
- **Training.** Chronological batches of 200 training events; every touched node is re-scanned from a detached
  state about 16 events back, so gradients flow through 16+ scan steps (truncated back-propagation through time;
  a catch-up over more than 64 events, e.g. after a timestamp shared by thousands of events, runs without
  gradient); one random training destination per positive; BCE; Adam, lr 1e-3; gradient clipping 1.0; early
  stopping on the *streaming* validation AP (with random negatives; on dense snapshots, where a node has more than 32
  events in one, the mean of the random, historical and inductive ones with a patience of 10:
  `docs/results/selection-experiments.md`). The paper: lr 1e-4, 100 epochs, patience 20, 5 seeds. Ours: at most
  100 epochs with a patience of 5 (10 on dense snapshots; down to 3 epochs, at least 500,000 training events, on long
  streams: MOOC), and the seeds of the first table.
- **Visibility.** "Exact" by default: a query at t sees every event with time < t and nothing at >= t, in training and
  in evaluation. The paper's neighbour sampling is also strictly-before-t, so this matches; memory models (TGN,
  JODIE) and TPNet update once per batch of 200: on continuous-time streams they see less, on snapshot streams
  (thousands of events per timestamp) they see the earlier batches of the query's own timestamp. On snapshot
  streams the trainer picks that "batch" visibility itself, with the rules that go with it (lists that hold a
  snapshot, snapshot pair features, per-node role counts), and the row is evaluated with it
  (`docs/results/visibility-experiments.md`).
- **Protocol.** DyGLib's split (70/15/15 time quantiles; 10% of all nodes, drawn among the nodes active after the
  validation time with `random.seed(2020)`, are held out of training for the inductive setting -- drawn from our
  sorted list of id strings, so the held-out set is not DyGLib's exact one), DyGLib's negative samplers (random
  destination; historical / inductive *pairs* from edges seen before the current evaluation batch and not inside
  it, inductive ones never seen up to the end of training; random top-up; seeds 0-3 as DyGLib) and DyGLib's
  batch-averaged AP (batches of 200). DyGLib evaluates the inductive setting in a separate pass; we score the
  inductive subset inside the same replay (same states, its own negatives with DyGLib's seeds).
- **Data.** Wikipedia's 172-d LIWC edge features and the 1-d edge weights of Can. Parl. / US Legis. were not
  available (see `../shared/data/README.md`); the paper had them. UCI's DyGLib features are all zero anyway.
- **Time.** Per-epoch times above were measured with 1 torch thread per run, two runs sharing the 2 cores of the
  machine named at the top (and, at times, a working session beside them), so they vary between epochs and
  between streams run on different days.
- **EdgeBank (ours)** remembers every edge seen strictly before the query time (exact visibility), evaluated on
  exactly our queries; the paper's EdgeBank column is DyGLib's (memory up to the evaluation batch).
"""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.results", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="runs/results")
    ap.add_argument("--doc", default="docs/RESULTS.md")
    ap.add_argument("--datasets", default="uci,canparl,uslegis,mooc,wikipedia")
    ap.add_argument(
        "--epochs", type=int, default=None, help="override every dataset's epoch budget"
    )
    ap.add_argument(
        "--max-train-events",
        type=int,
        default=None,
        help="override: train on the last N training events",
    )
    ap.add_argument("--mrr-k", type=int, default=None)
    ap.add_argument(
        "--no-ablation", action="store_true", help="the full model only (same as --variants full)"
    )
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="which models to train and evaluate",
    )
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument(
        "--no-node-classification",
        action="store_true",
        help="link rows only: no heads on the labelled streams' fresh link checkpoints"
        " (their section is kept as it is; a seed added with --reuse needs none)",
    )
    ap.add_argument("--reuse", action="store_true", help="skip steps whose outputs already exist")
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="only rewrite the document from existing summaries",
    )
    ap.add_argument(
        "--seeds", default="0,1,2", help="seeds of the full model (ablations run the first only)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--summaries",
        default=None,
        help="where each dataset's summary is kept between sessions "
        "(default: results/summaries beside --doc)",
    )
    node_results.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.node_classification:  # only the node-classification section
        torch.set_num_threads(args.threads)
        return node_results.run_from_args(args)
    unknown = set(args.variants.split(",")) - set(VARIANTS) - {""}
    if unknown:
        ap.error(f"unknown variant(s) {sorted(unknown)}")
    torch.set_num_threads(args.threads)
    out_root, names = Path(args.out), [d for d in args.datasets.split(",") if d]
    kept = node_results.kept_summaries_dir(args)
    if not args.render_only:
        for name in names:
            budget = dict(BUDGETS.get(name, _DEFAULT_BUDGET))
            if args.epochs is not None:
                budget["epochs"] = args.epochs
            if args.max_train_events is not None:
                budget["max_train_events"] = args.max_train_events
            if args.mrr_k is not None:
                budget["mrr_k"] = args.mrr_k
            wanted = ["full"] if args.no_ablation else [v for v in args.variants.split(",") if v]
            run_dataset(
                name,
                Path(args.data),
                out_root,
                budget,
                wanted,
                not args.no_baselines,
                args.reuse,
                [int(x) for x in args.seeds.split(",") if x],
                kept,
            )
            _render_all(out_root, kept, Path(args.doc))
    _render_all(out_root, kept, Path(args.doc))
    if not (args.render_only or args.no_node_classification):
        # heads on the labelled streams' fresh link checkpoints
        node_results.run_from_args(args, [n for n in names if n in node_results.LABELLED])
    node_results.update_doc(Path(args.doc), out_root, kept=kept)
    print(f"wrote {args.doc}")
    return 0


def _render_all(out_root: Path, kept: Path, doc: Path) -> None:
    """Render every dataset with a summary: this run's (``out_root``) where there is
    one, else the copy kept from an earlier session."""
    found = {p.parent.name: p for p in sorted(out_root.glob("*/summary.json"))}
    for p in sorted(kept.glob("*.json")) if kept.is_dir() else []:
        found.setdefault(p.stem, p)
    order = [n for n in NAMES if n in found] + sorted(n for n in found if n not in NAMES)
    summaries = [json.loads(found[n].read_text()) for n in order]
    render(summaries, doc, out_root, missing=[n for n in NAMES if n not in found])


if __name__ == "__main__":
    sys.exit(main())
