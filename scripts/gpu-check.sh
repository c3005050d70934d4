#!/usr/bin/env bash
# The GPU check, from binaries built elsewhere (nothing is compiled here):
#   cargo build --release -p xtask --features cuda
#   cargo test --release -p trainmem-alloc --features cuda --no-run
# then, on the GPU machine, from the repository root with target/ carried: scripts/gpu-check.sh
# (where target/ cannot travel, as on a lent machine: scripts/device-bundle.sh here, then
# scripts/device-check.sh there, which runs this check and the PyTorch recordings too)
# It writes fixtures/gpu-check/<device>/gpu-check.json (xtask gpu-check), the measured
# runs whole under runs/<scenario>/, and alloc-cuda.txt beside them (the allocator's CUDA test).
# Exit status: non-zero if either failed. XTASK and ALLOC_TEST name the binaries when they
# were carried elsewhere than target/release.
set -uo pipefail
cd "$(dirname "$0")/.."

xtask=${XTASK:-target/release/xtask}
[ -x "$xtask" ] || { echo "error: $xtask is missing: build it with --features cuda first" >&2; exit 2; }

status=0
"$xtask" gpu-check --backend cuda "$@" | tee /tmp/gpu-check.out || status=1
dir=$(sed -n 's/^wrote \(.*\)\/gpu-check.json$/\1/p' /tmp/gpu-check.out | tail -n 1)
[ -n "$dir" ] || dir=fixtures/gpu-check

alloc_test=${ALLOC_TEST:-$(ls -t target/release/deps/cuda_device-* 2>/dev/null | grep -v '\.d$' | head -n 1)}
if [ -n "$alloc_test" ]; then
  "$alloc_test" --nocapture 2>&1 | tee "$dir/alloc-cuda.txt" || status=1
else
  echo "note: the allocator's CUDA test binary is missing (cargo test --release -p trainmem-alloc --features cuda --no-run)" >&2
  status=1
fi
exit $status
