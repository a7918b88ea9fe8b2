"""deploy/alerts.yml: valid rule groups, loaded by prometheus.yml and mounted where it
says, and every metric its expressions use is one the service exports (the list the
dashboard test keeps)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse the rule file")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def dashboard_checks():
    spec = importlib.util.spec_from_file_location(
        "dashboard_checks", DEPLOY.parent / "tests" / "deploy" / "test_dashboard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_alert_rules_are_loaded_and_use_exported_metrics():
    checks = dashboard_checks()
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    names = set()
    alerts = {}
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            alerts[rule["alert"]] = rule
            assert rule["expr"].strip() and rule["annotations"]["summary"]
            names |= checks.promql_metric_names(rule["expr"])
    assert names <= checks.FIXED_METRICS.keys(), names - checks.FIXED_METRICS.keys()
    live = alerts["DygserveLiveAPBelowCheckpoint"]["expr"]
    assert "dygserve_live_ap" in live and "dygserve_checkpoint_test_ap" in live

    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert "/etc/prometheus/alerts.yml" in prom["rule_files"]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
