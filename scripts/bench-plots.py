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
- a side-by-side with istiod (`benches/istiod.rs` or `benches/ca_istiod.rs`, a file
  holding `ratios`): each ratio in meshd's favour against its target (istiod.svg).
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


# Each ratio drawn (istiod's figure over meshd's, or meshd's rate over istiod's, in
# meshd's favour) and the target for it, if it sets one.
TARGETS = {
    "memory_per_added_proxy": ("memory\nper proxy", 20),
    "cpu_per_proxy_per_push": ("CPU per proxy\nper push", 5),
    "convergence_p99": ("convergence\np99", 3),
    "connect_rate": ("connect\nrate", 3),
    "storm_final_config_p99": ("storm: all on\nlast write, p99", None),
    "storm_cpu": ("storm:\nCPU", None),
    "token_per_second": ("CA: first\ncertificates/s", None),
    "client_certificate_per_second": ("CA:\nrenewals/s", None),
}


def ratio(value):
    """A ratio as benches write it ({istiod, meshd, ratio}), or None."""
    return value.get("ratio") if isinstance(value, dict) else None


def istiod_plot(comparisons, path):
    """Bars of each ratio, one per comparison file that has it; the target, where the
    issue sets one, as a dashed mark over its group."""
    keys = [k for k in TARGETS if any(ratio(s["ratios"].get(k)) for _, s in comparisons)]
    names = [name.removesuffix(".json") for name, _ in comparisons]
    colours = {n: f"C{i}" for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labelled = set()
    for k, key in enumerate(keys):
        bars = [(n, ratio(s["ratios"].get(key))) for n, (_, s) in zip(names, comparisons)]
        bars = [(n, v) for n, v in bars if v]
        width = 0.8 / len(bars)
        for i, (n, v) in enumerate(bars):
            label = None if n in labelled else n
            labelled.add(n)
            ax.bar(k - 0.4 + width * (i + 0.5), v, width, color=colours[n], label=label)
        target = TARGETS[key][1]
        if target:
            ax.hlines(target, k - 0.45, k + 0.45, colors="black", linestyles="dashed")
    ax.axhline(1, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(keys)), [TARGETS[k][0] for k in keys], fontsize="x-small")
    ax.set_yscale("log")
    ax.set_ylabel("in meshd's favour (log; dashed: target)")
    ax.set_title("meshd against istiod, same machine, one sitting each")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
