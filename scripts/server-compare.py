#!/usr/bin/env python3
"""The table of scripts/server-compare.sh: each figure for the old and the new build, the
range over rounds."""
import glob
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "target/compare"


def load(build, scenario):
    runs = []
    for path in sorted(glob.glob(os.path.join(out, f"{build}-{scenario}-[0-9]*.json"))):
        with open(path) as f:
            text = f.read().strip()
        if text:
            runs.append(json.loads(text.splitlines()[-1] if scenario.startswith("grpcio") else text))
    return runs


FIGURES = [
    ("memory per added proxy, unscoped, plaintext (KB)", "memory-unscoped", lambda r: r["meshd"]["rss_per_added_proxy_bytes"] / 1000),
    ("memory per added proxy, scoped, plaintext (KB)", "memory-scoped", lambda r: r["meshd"]["rss_per_added_proxy_bytes"] / 1000),
    ("memory per added proxy, scoped, secure (KB)", "memory-scoped-secure", lambda r: r["meshd"]["rss_per_added_proxy_bytes"] / 1000),
    ("memory per added proxy, grpcio fleet of 500, unscoped (KB)", "grpcio-500", lambda r: r["rss_per_added_proxy_bytes"] / 1000),
    ("connect rate, plaintext, 5,000 proxies (/s)", "connect", lambda r: r["connect"]["initialised_per_second"]),
    ("connect rate, secure, 1,000 proxies (/s)", "connect-secure", lambda r: r["connect"]["initialised_per_second"]),
    ("VirtualService change to 5,000 proxies, p99 (ms)", "vs", lambda r: r["convergence_ms"]["p99"]),
    ("endpoint change to 5,000 proxies, p99 (ms)", "endpoint", lambda r: r["convergence_ms"]["p99"]),
    # CPU per push is not separable from the connect storm within one run: the whole
    # run's CPU (5,000 proxies connecting at 1,000/s, then 5 changes) is compared instead.
    ("meshd CPU, VirtualService run (s)", "vs", lambda r: r["meshd"]["cpu_seconds"]),
    ("meshd CPU, endpoint run (s)", "endpoint", lambda r: r["meshd"]["cpu_seconds"]),
]


def span(values):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    return f"{lo:,.1f}" if abs(hi - lo) < 0.05 else f"{lo:,.1f}–{hi:,.1f}"


print("| figure | home-made stacks | h2 + rustls |")
print("|---|---|---|")
for title, scenario, get in FIGURES:
    cells = []
    for build in ("old", "new"):
        vals = []
        for r in load(build, scenario):
            try:
                vals.append(get(r))
            except (KeyError, TypeError):
                vals.append(None)
        cells.append(span(vals))
    print(f"| {title} | {cells[0]} | {cells[1]} |")
