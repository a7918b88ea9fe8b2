"""The provisioned Grafana dashboard: valid JSON, every panel queries something, and every
metric its PromQL uses is one the service exports (the fixed list of the design).

``dashboard_metric_names()`` is meant for reuse by a live test against the real
service's ``/metrics``; it needs nothing but the standard library. From another test::

    import importlib.util, pathlib
    p = pathlib.Path(__file__).resolve().parents[1] / "deploy" / "test_dashboard.py"
    spec = importlib.util.spec_from_file_location("dashboard_checks", p)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    names = mod.dashboard_metric_names()  # e.g. {"dygserve_ingest_latency_seconds", ...}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "dygserve.json"
DATASOURCES = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# The service's Prometheus metrics (names fixed by the design): name -> (type, labels).
FIXED_METRICS: dict[str, tuple[str, frozenset[str]]] = {
    "dygserve_events_ingested_total": ("counter", frozenset()),
    "dygserve_events_applied_total": ("counter", frozenset()),
    "dygserve_events_rejected_total": ("counter", frozenset({"reason"})),
    "dygserve_events_duplicate_total": ("counter", frozenset()),
    "dygserve_ingest_latency_seconds": ("histogram", frozenset()),
    "dygserve_score_latency_seconds": ("histogram", frozenset({"route"})),
    "dygserve_batch_size": ("histogram", frozenset({"kind"})),
    "dygserve_cold_rebuilds_total": ("counter", frozenset()),
    "dygserve_apply_conflicts_total": ("counter", frozenset()),
    "dygserve_store_latency_seconds": ("histogram", frozenset({"op"})),
    "dygserve_model_info": ("gauge", frozenset({"version"})),
    "dygserve_kernel_path": ("gauge", frozenset({"path"})),
    "dygserve_in_flight_requests": ("gauge", frozenset()),
    "dygserve_http_requests_total": ("counter", frozenset({"route", "status"})),
    "dygserve_store_errors_total": ("counter", frozenset({"reason"})),
    "dygserve_store_memory_used_bytes": ("gauge", frozenset()),
    "dygserve_store_memory_max_bytes": ("gauge", frozenset()),
    "dygserve_store_evicted_keys_total": ("counter", frozenset()),
    # live evaluation (service/live_eval_metrics.py)
    "dygserve_live_ap": ("gauge", frozenset()),
    "dygserve_live_auc": ("gauge", frozenset()),
    "dygserve_live_mrr": ("gauge", frozenset()),
    "dygserve_live_window_samples": ("gauge", frozenset()),
    "dygserve_checkpoint_test_ap": ("gauge", frozenset()),
    "dygserve_live_eval_samples_total": ("counter", frozenset()),
    "dygserve_live_eval_skipped_total": ("counter", frozenset({"reason"})),
    "dygserve_live_score": ("histogram", frozenset({"label"})),
    "dygserve_nodes_classified_total": ("counter", frozenset({"route"})),
    "dygserve_classify_latency_seconds": ("histogram", frozenset({"route"})),
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
TARGET_LABELS = frozenset({"instance", "job"})  # added by Prometheus at scrape time

# PromQL words that look like identifiers but are no metric names (functions are
# recognised by the "(" that follows them).
_PROMQL_WORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
        "Inf",
        "NaN",
        "atan2",
    }
)
_GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"


def _strip_promql(expr: str) -> str:
    s = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)  # string literals
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " ", s)  # Grafana variables ($__rate_interval, ${x})
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery selectors
    s = re.sub(_GROUPING, " ", s)  # grouping label lists
    s = re.sub(r"\boffset\s+-?[\w.]+", " ", s)
    s = re.sub(r"@\s*[\w.()]+", " ", s)  # @ modifiers
    return s


def promql_metric_names(expr: str, strip_suffixes: bool = True) -> set[str]:
    """Metric names a PromQL expression selects; with ``strip_suffixes`` the histogram
    series suffixes ``_bucket``/``_sum``/``_count`` are removed (the family name)."""
    names: set[str] = set()
    for m in re.finditer(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", _strip_promql(expr)):
        name, call = m.group(1), m.group(2)
        if call or name in _PROMQL_WORDS:
            continue
        if strip_suffixes:
            for suf in HISTOGRAM_SUFFIXES:
                if name.endswith(suf):
                    name = name[: -len(suf)]
                    break
        names.add(name)
    return names


def promql_label_names(expr: str) -> set[str]:
    """Label names used in grouping clauses and label matchers of an expression."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    labels: set[str] = set()
    for group in re.findall(_GROUPING, s):
        labels |= {x.strip() for x in group.split(",") if x.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", s):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return labels


def load_dashboard(path: str | Path | None = None) -> dict:
    return json.loads(Path(path or DASHBOARD).read_text())


def iter_panels(dash: dict):
    """Every panel, including panels nested in rows."""
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])


def dashboard_exprs(path: str | Path | None = None) -> list[str]:
    dash = load_dashboard(path)
    exprs = [t["expr"] for p in iter_panels(dash) for t in p.get("targets", []) if t.get("expr")]
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if var.get("type") == "query" and isinstance(q, str) and q.strip():
            q = q.strip()
            m = re.fullmatch(r"label_values\((.*),\s*\w+\s*\)", q, re.S)
            if m:  # label_values(selector, label)
                exprs.append(m.group(1))
            elif q.startswith("label_values("):  # label_values(label): no metric
                continue
            else:  # query_result(expr) or a plain expression
                m = re.fullmatch(r"query_result\((.*)\)", q, re.S)
                exprs.append(m.group(1) if m else q)
    return exprs


def dashboard_metric_names(path: str | Path | None = None, strip_suffixes: bool = True) -> set[str]:
    """Every metric name used by the dashboard's PromQL (histogram suffixes stripped)."""
    names: set[str] = set()
    for e in dashboard_exprs(path):
        names |= promql_metric_names(e, strip_suffixes)
    return names


# --------------------------------------------------------------------------- tests


def test_promql_parser():
    e = (
        "histogram_quantile(0.99, sum by (le, route) (rate(dygserve_score_latency_seconds_bucket"
        '{route=~"score.*", job="x"}[$__rate_interval] offset 5m))) / clamp_min(sum(rate('
        "dygserve_http_requests_total[5m])) without (status), 1e-9) > bool 0.5"
    )
    assert promql_metric_names(e) == {
        "dygserve_score_latency_seconds",
        "dygserve_http_requests_total",
    }
    assert "dygserve_score_latency_seconds_bucket" in promql_metric_names(e, strip_suffixes=False)
    assert promql_label_names(e) == {"le", "route", "job", "status"}
    assert promql_metric_names(
        "sum(rate(a_total[1m])) by (x) + on(instance) group_left(version) b"
    ) == {"a_total", "b"}
    assert promql_metric_names("up") == {"up"}
    assert promql_metric_names('label_replace(foo, "dst", "$1", "src", "(.*)")') == {"foo"}


def test_dashboard_json_is_valid_and_provisionable():
    dash = load_dashboard()
    assert dash["uid"] == "dygserve" and dash["title"]
    assert isinstance(dash["schemaVersion"], int)
    panels = list(iter_panels(dash))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    ds_uid = re.search(r"^\s*uid:\s*(\S+)", DATASOURCES.read_text(), re.M).group(1)
    for p in panels:
        if p.get("type") == "row":
            continue
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        assert p["title"].strip()
        targets = p.get("targets") or []
        assert targets, f"panel {p['title']!r} has no targets"
        assert all(t.get("expr", "").strip() for t in targets), p["title"]
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), p["title"]
        for obj in [p, *targets]:
            ds = obj.get("datasource")
            if ds is not None:
                assert ds.get("type") == "prometheus" and ds.get("uid") == ds_uid, p["title"]


def test_dashboard_uses_only_exported_metrics():
    used = dashboard_metric_names()
    unknown = used - FIXED_METRICS.keys()
    assert not unknown, f"dashboard queries metrics the service does not export: {sorted(unknown)}"
    missing = FIXED_METRICS.keys() - used
    assert not missing, f"exported metrics with no panel: {sorted(missing)}"


def test_metric_types_and_labels_are_used_correctly():
    for expr in dashboard_exprs():
        raw = promql_metric_names(expr, strip_suffixes=False)
        allowed = set(TARGET_LABELS)
        for name in raw:
            family = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
            kind, labels = FIXED_METRICS[family]
            allowed |= labels
            if kind == "histogram":
                assert name != family, (
                    f"histogram {family} used without _bucket/_sum/_count: {expr}"
                )
                allowed.add("le")
            if kind == "counter" or name != family:  # counters and histogram series: rates only
                assert re.search(rf"\b(?:rate|irate|increase)\(\s*{re.escape(name)}\b", expr), expr
            if name.endswith("_bucket"):
                assert "histogram_quantile(" in expr and re.search(r"by\s*\([^)]*\ble\b", expr), (
                    expr
                )
        assert promql_label_names(expr) <= allowed, (expr, promql_label_names(expr) - allowed)


def test_legends_use_labels_that_exist():
    for p in iter_panels(load_dashboard()):
        for t in p.get("targets", []):
            legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
            allowed = set(TARGET_LABELS)
            for name in promql_metric_names(t["expr"]):
                allowed |= FIXED_METRICS[name][1]
            assert legend_labels <= allowed, (p["title"], legend_labels - allowed)


def test_required_panels_are_there():
    exprs = dashboard_exprs()

    def has(pattern: str) -> bool:
        return any(re.search(pattern, e) for e in exprs)

    assert has(r"rate\(dygserve_events_ingested_total")  # events/s
    assert has(r"rate\(dygserve_events_applied_total")  # how far applies keep up (wait=false)
    assert has(r"by \(reason\) \(rate\(dygserve_events_rejected_total")  # rejects by reason
    for q in ("0.5", "0.95", "0.99"):  # ingest and score latency quantiles
        assert has(
            rf"histogram_quantile\({q}, sum by \(le\) \(rate\(dygserve_ingest_latency_seconds_bucket"
        )
        assert has(
            rf"histogram_quantile\({q}, sum by \(le, route\) \(rate\(dygserve_score_latency_seconds_bucket"
        )
    assert has(r"rate\(dygserve_cold_rebuilds_total")
    assert has(r"rate\(dygserve_apply_conflicts_total")  # replicas colliding on the same nodes
    assert has(r"by \(le, op\) \(rate\(dygserve_store_latency_seconds_bucket")
    assert has(r"dygserve_model_info")
    assert has(r"dygserve_in_flight_requests")
    assert has(r"by \((le, )?kind\) \(rate\(dygserve_batch_size_")
    # the store's memory against its limit, its evictions, its errors by reason
    assert has(r"dygserve_store_memory_used_bytes") and has(r"dygserve_store_memory_max_bytes")
    assert has(r"rate\(dygserve_store_evicted_keys_total")
    assert has(r"by \(reason\) \(rate\(dygserve_store_errors_total")
    assert has(r"dygserve_live_ap") and has(r"dygserve_checkpoint_test_ap")  # live quality
    assert has(r"by \(le, label\) \(rate\(dygserve_live_score_bucket")
