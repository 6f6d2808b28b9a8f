#!/usr/bin/env python3
"""Writes charts/meshd/files/dashboard.json, the Grafana dashboard of meshd's control plane:
the seed's panels in its order (health, push pipeline, volume, resources). Run it after
changing a panel (`scripts/dashboard.py [OUT]`); tests/e2e/observability.rs checks that the
committed file is what the script writes and that every meshd metric it queries is one
meshd exports."""

import json
import pathlib
import sys

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def quantiles(metric, by="", qs=(0.5, 0.95, 0.99)):
    group = f"le{', ' + by if by else ''}"
    legend = f"p{{q}}{' {{' + by + '}}' if by else ''}"
    return [
        {
            "expr": f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[$__rate_interval])))",
            "legendFormat": legend.replace("{q}", str(int(q * 100))),
            "refId": chr(ord("A") + i),
        }
        for i, q in enumerate(qs)
    ]


def target(expr, legend, ref="A"):
    return {"expr": expr, "legendFormat": legend, "refId": ref}


def panel(title, kind, targets, unit, x, y, w=8, h=8, thresholds=None):
    p = {
        "title": title,
        "type": kind,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }
    if thresholds:
        p["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": thresholds}
    return p


def row(title, y):
    return {"title": title, "type": "row", "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}}


GREEN_AT_ZERO = [{"color": "green", "value": None}, {"color": "red", "value": 0.001}]

panels = [
    row("Health", 0),
    panel("Proxy convergence", "timeseries", quantiles("pilot_proxy_convergence_time"), "s", 0, 1, w=12),
    panel("Rejected configuration (NACKs/s)", "stat",
          [target("sum(rate(pilot_total_xds_rejects[$__rate_interval]))", "rejects")], "reqps", 12, 1, w=6,
          thresholds=GREEN_AT_ZERO),
    panel("Connected proxies", "stat", [target("sum(pilot_xds_clients)", "proxies")], "short", 18, 1, w=6),
    row("Push pipeline", 9),
    panel("Debounce p99", "timeseries", quantiles("pilot_debounce_time", qs=(0.99,)), "s", 0, 10),
    panel("Push time p99 by type", "timeseries", quantiles("pilot_xds_push_time", by="type", qs=(0.99,)), "s", 8, 10),
    panel("Queue time p99", "timeseries", quantiles("pilot_proxy_queue_time", qs=(0.99,)), "s", 16, 10),
    row("Volume", 18),
    panel("Pushes by type", "timeseries",
          [target("sum by (type) (rate(pilot_xds_pushes[$__rate_interval]))", "{{type}}")], "ops", 0, 19, w=12),
    panel("Push context recomputes", "timeseries",
          [target("sum(rate(pilot_push_context_recompute_count[$__rate_interval]))", "recomputes")], "ops", 12, 19,
          w=12),
    row("Resources", 27),
    panel("Services and virtual services", "timeseries",
          [target("sum(pilot_services)", "services", "A"), target("sum(pilot_virt_services)", "virtual services", "B")],
          "short", 0, 28),
    panel("CPU", "timeseries",
          [target('sum by (pod) (rate(process_cpu_seconds_total{job=~"$job"}[$__rate_interval]))', "{{pod}}")],
          "percentunit", 8, 28),
    panel("Memory", "timeseries",
          [target('sum by (pod) (process_resident_memory_bytes{job=~"$job"})', "{{pod}}")], "bytes", 16, 28),
]
for i, p in enumerate(panels):
    p["id"] = i + 1

dashboard = {
    "title": "meshd control plane",
    "uid": "meshd-control-plane",
    "tags": ["meshd", "istio"],
    "timezone": "browser",
    "schemaVersion": 39,
    "refresh": "30s",
    "time": {"from": "now-1h", "to": "now"},
    "templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus"},
        {"name": "job", "type": "custom", "query": "meshd", "current": {"text": "meshd", "value": "meshd"},
         "includeAll": False},
    ]},
    "panels": panels,
}
default = pathlib.Path(__file__).resolve().parent.parent / "charts/meshd/files/dashboard.json"
out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default
out.write_text(json.dumps(dashboard, indent=2) + "\n")
