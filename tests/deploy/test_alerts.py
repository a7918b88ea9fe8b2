"""deploy/alerts.yml: loaded by Prometheus (prometheus.yml names it, compose mounts it),
well formed, and every expression queries metrics the service exports with their
labels (the dashboard checks' list). ``promtool check rules`` too where installed."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse the rule files")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ALERTS = DEPLOY / "alerts.yml"


def _dashboard_checks():
    spec = importlib.util.spec_from_file_location(
        "dashboard_checks", DEPLOY.parent / "tests" / "deploy" / "test_dashboard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_prometheus_loads_the_rules_that_compose_mounts() -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (path,) = prom["rule_files"]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounts = [v.split(":") for v in compose["services"]["prometheus"]["volumes"]]
    sources = {
        target: (DEPLOY / src).resolve() for src, target, *_ in mounts if src.startswith(".")
    }
    assert sources.get(path) == ALERTS


def test_rules_are_well_formed_and_query_exported_metrics() -> None:
    checks = _dashboard_checks()
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)) and names
    for r in rules():
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        assert r["annotations"]["summary"].strip(), r["alert"]
        assert str(r["for"])[-1] in "sm", r["alert"]
        used = checks.promql_metric_names(r["expr"])
        unknown = used - checks.FIXED_METRICS.keys()
        assert not unknown, (r["alert"], unknown)
        allowed = set(checks.TARGET_LABELS)
        for name in used:
            allowed |= checks.FIXED_METRICS[name][1]
        assert checks.promql_label_names(r["expr"]) <= allowed, r["alert"]
    exprs = " ".join(r["expr"] for r in rules())
    # the alert: store memory against its limit, and a full store
    for metric in (
        "dygserve_store_memory_used_bytes",
        "dygserve_store_memory_max_bytes",
        "dygserve_store_evicted_keys_total",
        "dygserve_store_errors_total",
    ):
        assert metric in exprs, metric
    # and live quality against the served checkpoint's test AP (service/live_eval.py)
    live = next(r["expr"] for r in rules() if r["alert"] == "DygserveLiveAPBelowCheckpoint")
    assert "dygserve_live_ap" in live and "dygserve_checkpoint_test_ap" in live


def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: only the parse-based checks ran")
    r = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
