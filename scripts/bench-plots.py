#!/usr/bin/env python3
"""Draws BENCHMARKS.md's plots from the JSON summaries `meshd loadgen --json` writes.

Usage: scripts/bench-plots.py [DATA_DIR] [OUT_DIR]  (defaults: docs/plots/data, docs/plots)

Each summary is placed by its own settings, not by its file name:
- no changes and a warm-up (`--change none --warm-proxies K`): a point of meshd's memory
  against connected proxies, one line per kind of fleet (unscoped or Sidecar-scoped,
  plaintext or secure);
- changes (`--change vs|endpoint`): the distribution of convergence times over every
  affected proxy of every change;
- every summary with a fleet of 1,000 proxies or more and no warm-up: the share of the
  fleet holding its whole initial configuration against the time since the simulator
  began connecting it, at the connect rate it offered (the connect storm's curve);
- a side-by-side with istiod (`benches/istiod.rs`, a file holding `ratios`): each ratio in
  meshd's favour against its target (istiod.svg).
Needs matplotlib (`pip install matplotlib`).
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MB = 1024 * 1024


def fleet(settings):
    scope = "Sidecar-scoped" if settings["sidecar_scoped"] else "unscoped"
    port = "secure port" if settings["secure"] else "plaintext"
    return f"{scope}, {port}"


def cdf(ax, percentiles, label):
    """One line of a distribution: the sample at each whole percentile."""
    by_percent = percentiles.get("by_percent") or []
    if by_percent:
        ax.plot(by_percent, range(1, len(by_percent) + 1), label=label)


def main():
    data = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/plots/data")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/plots")
    summaries = [(p.name, json.loads(p.read_text())) for p in sorted(data.glob("*.json"))]
    if not summaries:
        sys.exit(f"no JSON summaries in {data}")
    comparisons = [(name, s) for name, s in summaries if "ratios" in s]
    summaries = [(name, s) for name, s in summaries if "ratios" not in s]

    memory = defaultdict(list)
    fig_conv, ax_conv = plt.subplots(figsize=(7, 4))
    fig_conn, ax_conn = plt.subplots(figsize=(7, 4))
    for name, s in summaries:
        settings = s["settings"]
        if settings["change"] == "none" and settings["warm_proxies"]:
            proxies = settings["proxies"] + settings["gateways"]
            memory[fleet(settings)].append((proxies, s["meshd"]["rss_connected_bytes"] / MB))
        if settings["change"] in ("vs", "endpoint"):
            what = "VirtualService" if settings["change"] == "vs" else "endpoint"
            label = f"{what} change, {settings['proxies']} proxies ({name})"
            cdf(ax_conv, s["convergence_ms"], label)
        if settings["proxies"] >= 1000 and not settings["warm_proxies"]:
            rate = s["connect"]["initialised_per_second"]
            offered = settings["connect_rate"]
            label = f"{settings['proxies']} {fleet(settings)}, {offered:,.0f}/s offered: {rate:,.0f}/s ({name})"
            cdf(ax_conn, s["connect"]["initial_config_ms"], label)

    out.mkdir(parents=True, exist_ok=True)
    if comparisons:
        istiod_plot(comparisons, out / "istiod.svg")
    if memory:
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, points in sorted(memory.items()):
            points.sort()
            ax.plot([p for p, _ in points], [m for _, m in points], marker="o", label=label)
        ax.set_xlabel("connected proxies")
        ax.set_ylabel("meshd RSS (MiB)")
        ax.set_title("meshd's memory against connected proxies (1,000 services)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "memory.svg")
    for fig, ax, file, title, xlabel in [
        (fig_conv, ax_conv, "convergence.svg", "Time from a change to each affected proxy holding it", "ms after the change"),
        (fig_conn, ax_conn, "connect.svg", "Connect storm: proxies holding their initial configuration", "ms since the simulator began connecting"),
    ]:
        if not ax.lines:
            continue
        ax.set_xlabel(xlabel)
        ax.set_ylabel("% of proxies")
        ax.set_title(title)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
        fig.tight_layout()
        fig.savefig(out / file)


# The targets for each ratio (istiod's figure over meshd's, or meshd's rate over
# istiod's), in meshd's favour.
TARGETS = {
    "memory_per_added_proxy": ("memory per proxy", 20),
    "cpu_per_proxy_per_push": ("CPU per proxy per push", 5),
    "convergence_p99": ("convergence p99", 3),
    "connect_rate": ("connect rate", 3),
}


def istiod_plot(comparisons, path):
    """Bars of each ratio per comparison file, the target as a mark over each group."""
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = list(TARGETS)
    width = 0.8 / len(comparisons)
    for i, (name, s) in enumerate(comparisons):
        values = [(s["ratios"].get(k) or {}).get("ratio", 0) for k in keys]
        xs = [k + i * width for k in range(len(keys))]
        ax.bar(xs, values, width, label=name.removesuffix(".json"))
    for k, key in enumerate(keys):
        target = TARGETS[key][1]
        ax.hlines(target, k - width / 2, k + 0.8 - width / 2, colors="black", linestyles="dashed")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))], [TARGETS[k][0] for k in keys], fontsize="small")
    ax.set_yscale("log")
    ax.set_ylabel("istiod / meshd (log; dashed: target)")
    ax.set_title("meshd against istiod, same fleet and mesh, one sitting")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
