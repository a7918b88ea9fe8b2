"""docs/RESULTS.md rendering from per-dataset summaries (no training)."""

from __future__ import annotations

import pytest

from training.results import PAPER_TABLE4, main, render


def _m(ap: float) -> dict:
    return {
        "ap": ap,
        "auc": ap,
        "ap_global": ap,
        "auc_global": ap,
        "n_positives": 10,
        "n_batches": 1,
    }


def test_render_contains_paper_and_ours(tmp_path) -> None:
    strat = {"random": _m(0.97), "historical": _m(0.83), "inductive": _m(0.79)}
    summary = {
        "dataset": "uci",
        "budget": {"epochs": 8, "max_train_events": None},
        "variants": {
            "full": {
                "train": {
                    "history": [{"epoch": 0, "epoch_time_s": 60.0, "eval_time_s": 20.0}],
                    "best_epoch": 0,
                    "mean_epoch_time_s": 60.0,
                    "events": 59835,
                    "train_events": 31770,
                    "train_events_total": 31770,
                },
                "eval": {
                    "test": {
                        "transductive": strat,
                        "inductive": strat,
                        "mrr": {"mrr": 0.88, "k": 20},
                    },
                    "val": {"transductive": strat},
                    "replay_seconds": 100.0,
                },
            },
            "features_only": {
                "train": {
                    "history": [{}],
                    "mean_epoch_time_s": 5.0,
                    "config": {"identity_match_dim": 16, "identity_match_depth": 2},
                },
                "eval": {"test": {"transductive": strat}},
            },
        },
        "baselines": {
            "edgebank": {"test": {"transductive": strat}},
            "recompute": {"test": {"transductive": {"random": _m(0.95)}}, "replay_seconds": 50.0},
        },
    }
    doc = tmp_path / "RESULTS.md"
    render([summary], doc, tmp_path)
    text = doc.read_text()
    assert PAPER_TABLE4["uci"]["rnd"]["DyG-Mamba"] in text and "**97.00**" in text
    assert "+2.00" in text  # cached - recompute gap
    assert "How our setting differs" in text
    assert (
        "pair/activity features only (use_state=False) + identity match (width 16, depth 2)" in text
    )


def test_unknown_variant_is_refused(tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["--variants", "full,nonsense", "--out", str(tmp_path), "--render-only"])
