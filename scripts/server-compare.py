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
    ("memory per added proxy, unscoped, secure (KB)", "memory-unscoped-secure", lambda r: r["meshd"]["rss_per_added_proxy_bytes"] / 1000),
    ("memory per added proxy, unscoped, 10,000 proxies (KB)", "memory-unscoped-10k", lambda r: r["meshd"]["rss_per_added_proxy_bytes"] / 1000),
    ("memory per added proxy, scoped, 10,000 proxies (KB)", "memory-scoped-10k", lambda r: r["meshd"]["rss_per_added_proxy_bytes"] / 1000),
    ("memory per added proxy, scoped, secure, 10,000 proxies (KB)", "memory-scoped-secure-10k", lambda r: r["meshd"]["rss_per_added_proxy_bytes"] / 1000),
    ("RSS with 10,000 scoped secure proxies (MB)", "memory-scoped-secure-10k", lambda r: r["meshd"]["rss_connected_bytes"] / 1e6),
    ("memory per added proxy, grpcio fleet of 500, unscoped (KB)", "grpcio-500", lambda r: r["rss_per_added_proxy_bytes"] / 1000),
    ("memory per added proxy, grpcio fleet of 2,000, unscoped (KB)", "grpcio-2000", lambda r: r["rss_per_added_proxy_bytes"] / 1000),
    ("connect rate, plaintext, 5,000 proxies (/s)", "connect", lambda r: r["connect"]["initialised_per_second"]),
    ("connect rate, secure, 1,000 proxies (/s)", "connect-secure", lambda r: r["connect"]["initialised_per_second"]),
    ("meshd CPU per connected proxy, plaintext (ms)", "connect", lambda r: r["meshd"]["cpu_seconds_connecting"] * 1000 / r["settings"]["proxies"]),
    ("meshd CPU per connected proxy, secure (ms)", "connect-secure", lambda r: r["meshd"]["cpu_seconds_connecting"] * 1000 / r["settings"]["proxies"]),
    ("VirtualService change to 5,000 proxies, p99 (ms)", "vs", lambda r: r["convergence_ms"]["p99"]),
    ("endpoint change to 5,000 proxies, p99 (ms)", "endpoint", lambda r: r["convergence_ms"]["p99"]),
    # From the settled fleet to the last change's convergence, over the proxies each
    # change reached.
    ("meshd CPU per proxy per push, VirtualService change (µs)", "vs", lambda r: r["meshd"]["cpu_us_per_proxy_per_push"]),
    ("meshd CPU per proxy per push, endpoint change (µs)", "endpoint", lambda r: r["meshd"]["cpu_us_per_proxy_per_push"])]


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
