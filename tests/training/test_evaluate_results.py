"""docs/RESULTS.md rendering from per-dataset summaries (no training)."""

from __future__ import annotations

import json

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
            "no_transitions": {
                "train": {"history": [{}], "mean_epoch_time_s": 50.0},
                "eval": {"test": {"transductive": {**strat, "random": _m(0.91)}}},
            },
            "no_transition_decay": {
                "train": {"history": [{}, {}], "mean_epoch_time_s": 51.0},
                "eval": {"test": {"transductive": {**strat, "random": _m(0.96)}}},
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
    assert (
        "| UCI | without transition counts (transition_buckets=0) | 91.00 | 83.00 | 79.00 |" in text
    )
    assert (
        "| UCI | transition counts not decayed (transition_decay=0) | 96.00 | 83.00 | 79.00 | 2 |"
        in text
    )
    # Without seed statistics the goal table shows the single run beside the best published.
    assert "| UCI | 97.00 / 97.35 TPNet | 83.00 / 93.96 PINT | 79.00 / 83.61 PINT |" in text

    summary["seed_stats"] = {
        "random": {"mean": 0.97, "std": 0.005, "n": 3},
        "historical": {"mean": 0.85, "std": 0.01, "n": 3},
        "inductive": {"mean": 0.80, "std": 0.02, "n": 3},
    }
    render([summary], doc, tmp_path)
    assert "| UCI | 97.00 ± 0.50 (3) / 97.35 TPNet | 85.00 ± 1.00 (3) / 93.96 PINT |" in (
        doc.read_text()
    )


def test_unknown_variant_is_refused(tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["--variants", "full,nonsense", "--out", str(tmp_path), "--render-only"])


def test_seed_statistics_are_the_mean_and_spread_of_every_seed(tmp_path) -> None:
    from training.results import _run_more_seeds

    strat = {"random": _m(0.96), "historical": _m(0.80), "inductive": _m(0.70)}
    summary = {
        "variants": {
            "full": {
                "eval": {"test": {"transductive": strat}},
                # seed 1 already run (reuse): nothing is trained here
                "seeds": {"1": {"random": 0.98, "historical": 0.84, "inductive": 0.74}},
            }
        }
    }
    budget = {"epochs": 1, "patience": 1, "max_train_events": None}
    saved: list[dict] = []

    def save() -> None:
        saved.append(json.loads(json.dumps(summary["seed_stats"])))

    _run_more_seeds("uci", tmp_path, tmp_path, budget, {}, (0, 1), summary, True, None, None, save)
    assert saved and saved[-1] == summary["seed_stats"]  # what is kept is what is shown
    st = summary["seed_stats"]
    assert st["random"]["n"] == 2
    assert st["random"]["mean"] == pytest.approx(0.97)
    assert st["historical"]["std"] == pytest.approx(0.02)
    assert not any(tmp_path.iterdir())  # no run was started


def _summary(name: str, means: dict[str, float], n: int = 3) -> dict:
    strat = {k: _m(v) for k, v in means.items()}
    return {
        "dataset": name,
        "budget": {"epochs": 100, "max_train_events": None},
        "finished": "2026-11-27T09:00:00+00:00",
        "machine": {"cpu": "Test CPU", "cores": 2, "torch": "torch 2.13.0+cpu"},
        "variants": {
            "full": {"train": {"history": [{}]}, "eval": {"test": {"transductive": strat}}}
        },
        "seed_stats": {k: {"mean": v, "std": 0.001, "n": n} for k, v in means.items()},
    }


def test_a_cell_at_its_goal_is_bold_and_each_stream_says_how_far_the_others_are(
    tmp_path,
) -> None:
    doc = tmp_path / "RESULTS.md"
    uci = _summary("uci", {"random": 0.9700, "historical": 0.9500, "inductive": 0.9000})
    render([uci], doc, tmp_path, missing=["mooc"])
    text = doc.read_text()
    assert "| UCI | 97.00 ± 0.10 (3) / 97.35 TPNet | **95.00 ± 0.10 (3)** / 93.96 PINT |" in text
    assert "- **UCI** meets the goal on hist, ind; rnd 0.35 below TPNet (97.35)." in text
    assert "- UCI: finished 2026-11-27T09:00:00+00:00 (Test CPU, 2 cores" in text
    assert "not run with today's trainer yet: MOOC." in text
    # One seed has no spread to give.
    render(
        [_summary("uci", {"random": 0.97, "historical": 0.9, "inductive": 0.8}, n=1)], doc, tmp_path
    )
    assert "| UCI | 97.00 (1) / 97.35 TPNet |" in doc.read_text()


def test_ours_is_bold_in_the_paper_table_only_where_it_beats_every_paper_mean(tmp_path) -> None:
    """DyG-Mamba's table: Can. Parl. random 98.20 is the best paper mean of its row."""
    doc = tmp_path / "RESULTS.md"
    canparl = _summary("canparl", {"random": 0.9253, "historical": 0.9900, "inductive": 0.90})
    render([canparl], doc, tmp_path)
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| Can. Parl. | ")]
    rnd = next(line for line in rows if line.startswith("| Can. Parl. | rnd |"))
    hist = next(line for line in rows if line.startswith("| Can. Parl. | hist |"))
    assert "| 92.53 |" in rnd and "**92.53**" not in rnd
    assert "| **99.00** |" in hist  # above DyG-Mamba's 97.39, the best of the row


def test_rendering_keeps_the_node_classification_section_and_what_follows_it(tmp_path) -> None:
    from training.node_results import BEGIN, END

    doc = tmp_path / "RESULTS.md"
    tail = f"{BEGIN}\n## Dynamic node classification\n| x |\n{END}\n\n### A note by hand\nkept\n"
    doc.write_text("# old link tables\nstale row\n\n" + tail)
    render([_summary("uci", {"random": 0.97, "historical": 0.9, "inductive": 0.8})], doc, tmp_path)
    text = doc.read_text()
    assert "stale row" not in text and "| UCI |" in text
    assert text.endswith(tail) and text.count(BEGIN) == 1


def test_render_only_uses_the_kept_summaries_where_this_run_has_none(tmp_path) -> None:
    import json

    doc, out = tmp_path / "RESULTS.md", tmp_path / "runs"
    kept = tmp_path / "results" / "summaries"  # the default: beside --doc
    kept.mkdir(parents=True)
    for name, ap in (("uci", 0.90), ("uslegis", 0.70)):
        (kept / f"{name}.json").write_text(
            json.dumps(_summary(name, {"random": ap, "historical": ap, "inductive": ap}))
        )
    # The node-classification copies beside them are not link rows.
    (kept / "node_classification").mkdir()
    run = {"seed": 0, "epochs_run": 3, "val": {"auc": 0.9, "ap": 0.1}}
    run["test"] = {"auc": 0.9123, "ap": 0.02, "n_positives": 44, "n_events": 23621}
    nc = {"dataset": "wikipedia", "base": "b", "link_model_version": "v", "runs": [run]}
    nc["train_config"] = {"epochs": 200, "patience": 20}
    (kept / "node_classification" / "wikipedia.json").write_text(json.dumps(nc))
    # This run's own summary of UCI wins over the kept one.
    (out / "uci").mkdir(parents=True)
    (out / "uci" / "summary.json").write_text(
        json.dumps(_summary("uci", {"random": 0.95, "historical": 0.95, "inductive": 0.95}))
    )
    assert main(["--out", str(out), "--doc", str(doc), "--render-only", "--datasets", "uci"]) == 0
    text = doc.read_text()
    assert "| UCI | 95.00 ± 0.10 (3) / 97.35 TPNet" in text
    assert "| US Legis. | 70.00 ± 0.10 (3) / 80.58 TPNet" in text
    assert "not run with today's trainer yet: Can. Parl., MOOC, Wikipedia." in text
    # ... but they are the node-classification section's rows
    assert "| Wikipedia (banned editors) | **91.23** |" in text
