"""The streaming evaluator: TGB's "score, then update" with exact visibility
(the replay itself lives in ``training.replay``).

The whole stream is replayed in time order. Events before the evaluated region are
ingested without scoring; then, for each group of evaluated events that share a
timestamp, every query at that time (positives and their negatives) is FIRST scored
from the current states and recent-neighbour lists with ``streaming.score`` (so from
the states after every event with time < t), and THEN the group is ingested with
``streaming.advance`` (each node's events in (t, seq) order, seq = row index) and
the neighbour lists get the group's (key, t) entries (last ``neighbour_list_len``
per node). These are the two functions the HTTP service runs, so replaying the same
stream through the service gives the same scores (``--write-scores`` writes them).

``visibility="batch"`` (TGN/TGB memory style, for comparison) groups the evaluated
events in fixed batches of 200 consecutive events instead of timestamps.

Protocol (DyGLib): chronological 70/15/15 split at the time quantiles; settings
"transductive" (all validation/test events) and "inductive" (events with at least
one endpoint never seen in training); negatives random / historical / inductive
(``negatives.py``; seeds: val 0, inductive val 1, test 2, inductive test 3); AP and
AUC averaged over evaluation batches of 200 positives (DyGLib) and global; MRR
against K random destinations per positive (TGB style).

CLI::

    python -m training.evaluate --checkpoint DIR --data PATH [--out DIR]
        [--visibility exact|batch] [--write-scores FILE] [--mrr-k 20]
        [--max-events N] [--splits val,test] [--baselines]
    python -m training.evaluate --checkpoint DIR --data PATH --live-record FILE
        (the pairs a running service scored live, ``training.live_record``)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from model.checkpoint import load_checkpoint
from model.link_model import DygMambaLinkModel

from .baselines import run_baselines
from .batches import IndexedStream
from .data import ChronologicalSplit, chronological_split, read_edge_stream
from .jsonable import jsonable
from .live_record import LiveRecord, score_live_record
from .negatives import STRATEGIES
from .plots import plot_score_histograms, plot_training_curves
from .replay import Queries, build_queries, replay, summarise, write_scores


def evaluate_model(
    model: DygMambaLinkModel,
    data: IndexedStream,
    split: ChronologicalSplit,
    splits: Sequence[str] = ("val", "test"),
    settings: Sequence[str] = ("transductive", "inductive"),
    strategies: Sequence[str] = STRATEGIES,
    mrr_k: int = 20,
    visibility: str = "exact",
    progress: bool = False,
) -> tuple[dict[str, Any], Queries]:
    queries = build_queries(data, split, splits, settings, strategies, mrr_k)
    t0 = time.perf_counter()
    replay(model, data, queries, visibility, progress=progress)
    metrics = summarise(queries, splits)
    metrics["replay_seconds"] = time.perf_counter() - t0
    metrics["visibility"] = visibility
    return metrics, queries


# The validation negatives a training run selects its best epoch on (``--select-on``):
# random ones alone, as DyGLib selects, or the mean AP over all three kinds.
SELECTION_NEGATIVES: dict[str, tuple[str, ...]] = {
    "random": ("random",),
    "mean": ("random", "historical", "inductive"),
}


def validation_metrics(
    model: DygMambaLinkModel,
    data: IndexedStream,
    split: ChronologicalSplit,
    visibility: str = "exact",
    negatives: Sequence[str] = ("random",),
) -> dict[str, dict[str, float]]:
    """The per-epoch check: streaming replay on validation, transductive; the metrics of
    each kind of negatives asked for."""
    m, _ = evaluate_model(model, data, split, ("val",), ("transductive",), negatives, 0, visibility)
    return {kind: m["val"]["transductive"][kind] for kind in negatives}


def validation_ap(
    model: DygMambaLinkModel,
    data: IndexedStream,
    split: ChronologicalSplit,
    visibility: str = "exact",
) -> dict[str, float]:
    """Validation metrics with random negatives."""
    return validation_metrics(model, data, split, visibility)["random"]


def trained_visibility(checkpoint_metrics: dict[str, Any]) -> str:
    """The visibility a checkpoint was trained with ("exact" for one that does not say):
    evaluate the way the model was trained (DESIGN: "Train with the visibility you
    evaluate with")."""
    return str(checkpoint_metrics.get("visibility") or "exact")


# ===================================================================== CLI
def wants_node_evaluation(argv: Sequence[str]) -> bool:
    """``--task node-classification``, or no ``--task`` and a checkpoint with a node head
    (``--task link`` evaluates such a checkpoint's link model)."""
    from model.node_head_checkpoint import has_node_head

    from .node_task import asks_node_task

    if asks_node_task(argv):
        return True
    if "--task" in argv or any(a.startswith("--task=") for a in argv):
        return False
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--checkpoint":
            return has_node_head(value)
    return any(a.startswith("--checkpoint=") and has_node_head(a.split("=", 1)[1]) for a in argv)


def default_out_dir(checkpoint: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    ckpt = checkpoint.resolve()
    return ckpt.parent / f"{ckpt.name}-eval-{stamp}"


def load_data(
    path: str | Path, max_events: int | None = None
) -> tuple[IndexedStream, ChronologicalSplit]:
    stream = read_edge_stream(path, limit=max_events)
    return IndexedStream.build(stream), chronological_split(stream)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_node_evaluation(argv):  # a checkpoint with a node head, or --task node-classification
        from .node_evaluate import main as evaluate_node_classifier

        return evaluate_node_classifier(argv)
    ap = argparse.ArgumentParser(prog="dygserve evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--task", choices=("link",), default="link", help="node-classification: see above"
    )
    ap.add_argument(
        "--checkpoint", required=True, help="checkpoint folder (config.json + weights.safetensors)"
    )
    ap.add_argument("--data", required=True, help="dataset folder or edges.csv.gz")
    ap.add_argument(
        "--out", default=None, help="output folder (default: a new folder beside the checkpoint)"
    )
    ap.add_argument(
        "--visibility",
        choices=("exact", "batch"),
        default=None,
        help="default: the visibility the checkpoint was trained with (its metrics.json), else exact",
    )
    ap.add_argument(
        "--write-scores",
        default=None,
        metavar="FILE",
        help="write every query and its logit as CSV",
    )
    ap.add_argument(
        "--mrr-k", type=int, default=20, help="negatives per positive for MRR (0 = off)"
    )
    ap.add_argument(
        "--max-events", type=int, default=None, help="only the first N events of the stream"
    )
    ap.add_argument("--splits", default="val,test")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--settings", default="transductive,inductive")
    ap.add_argument(
        "--baselines",
        action="store_true",
        help="also EdgeBank and the recompute-from-scratch variant",
    )
    ap.add_argument("--recompute-window", type=int, default=32, help="L for the recompute baseline")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--live-record",
        default=None,
        metavar="FILE",
        help="score the pairs of a live-evaluation record (DYGSERVE_LIVE_EVAL_RECORD) instead",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    ckpt = load_checkpoint(args.checkpoint)
    out = Path(args.out) if args.out else default_out_dir(Path(args.checkpoint))
    if (
        out.resolve() == Path(args.checkpoint).resolve()
        or Path(args.checkpoint).resolve() in out.resolve().parents
    ):
        ap.error("--out must not be inside the checkpoint folder")
    out.mkdir(parents=True, exist_ok=True)
    data, split = load_data(args.data, args.max_events)
    if data.feature_dim != ckpt.config.edge_feature_dim:
        ap.error(
            f"the data has {data.feature_dim} edge features, the checkpoint expects {ckpt.config.edge_feature_dim}"
        )
    if args.live_record:
        live = score_live_record(ckpt.model, data, LiveRecord.read(args.live_record))
        live.pop("logits")
        live["model_version"] = ckpt.version
        (out / "metrics.json").write_text(
            json.dumps(jsonable({"live_record": live}), indent=2, sort_keys=True) + "\n"
        )
        print(
            f"live record: {live['samples']} samples, offline AP {live['ap_offline']:.6f}, "
            f"served AP {live['ap_served']:.6f}, max |logit difference| "
            f"{live['max_abs_logit_difference']:.2e}"
        )
        print(f"wrote {out}")
        return 0
    splits = tuple(s for s in args.splits.split(",") if s)
    metrics, queries = evaluate_model(
        ckpt.model,
        data,
        split,
        splits,
        tuple(args.settings.split(",")),
        tuple(args.strategies.split(",")),
        args.mrr_k,
        args.visibility or trained_visibility(ckpt.metrics),
        progress=True,
    )
    metrics["checkpoint"] = str(Path(args.checkpoint).resolve())
    metrics["model_version"] = ckpt.version
    metrics["data"] = str(args.data)
    metrics["events"] = len(data)
    if args.baselines:
        metrics["baselines"] = run_baselines(
            ckpt.model, data, split, splits, recompute_window=args.recompute_window
        )
    if args.write_scores:
        write_scores(args.write_scores, data, queries)
    (out / "metrics.json").write_text(
        json.dumps(jsonable(metrics), indent=2, sort_keys=True) + "\n"
    )
    plot_score_histograms(queries, out / "score_histograms.png")
    if ckpt.metrics.get("history"):
        plot_training_curves(ckpt.metrics["history"], out / "training_curves.png")
    _print_summary(metrics)
    print(f"wrote {out}")
    return 0


def _print_summary(metrics: dict[str, Any]) -> None:
    for split_name in ("val", "test"):
        res = metrics.get(split_name)
        if not res:
            continue
        for setting in ("transductive", "inductive"):
            for strategy, m in res.get(setting, {}).items():
                print(
                    f"{split_name:5s} {setting:12s} {strategy:10s} AP {100 * m['ap']:.2f}  AUC {100 * m['auc']:.2f}  (global AP {100 * m['ap_global']:.2f}, n={m['n_positives']})"
                )
        if "mrr" in res:
            print(f"{split_name:5s} MRR@{res['mrr']['k']} {res['mrr']['mrr']:.4f}")


if __name__ == "__main__":
    sys.exit(main())
