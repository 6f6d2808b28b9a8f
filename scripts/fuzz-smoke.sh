#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 10) on stable Rust: cargo-fuzz with
# RUSTC_BOOTSTRAP=1 and no sanitizer, a debug build. A crash fails the run and leaves
# its input under fuzz/artifacts/TARGET/. Longer runs: `just fuzz TARGET SECONDS`.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
version=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$version"; then
    cargo install --locked cargo-fuzz --version "$version"
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
targets=$(cargo fuzz list)
cargo fuzz build --dev --sanitizer none
for target in $targets; do
    echo "== fuzz $target for ${seconds}s" >&2
    cargo fuzz run --dev --sanitizer none "$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 2>&1 |
        grep -E "^(Done|stat::number_of_executed_units|==|ERROR|SUMMARY)" || true
    if [ -n "$(ls -A "artifacts/$target" 2>/dev/null)" ]; then
        echo "fuzz target $target crashed: see fuzz/artifacts/$target" >&2
        exit 1
    fi
done
