#!/usr/bin/env bash
# Prepares scripts/device-check.sh for a lent GPU, here, with no GPU: a device call carries the
# working tree and at most 64 MiB in all, so the binaries travel stripped and xz-compressed.
#   .device/bin/xtask-cuda.xz       cargo build --release -p xtask --features cuda
#   .device/bin/xtask-fusion.xz     cargo build --release -p xtask --features fusion
#   .device/bin/alloc-cuda-test.xz  the allocator's CUDA test (trainmem-alloc, --features cuda)
#   .whl/litgpt-*.whl               litgpt for record_cuda.sh (the GPU image has torch,
#                                   transformers, peft and lightning, not litgpt)
# Then it adds up what would travel and fails if it is over the limit, and prints the call.
# Both folders are ignored by git. SKIP_BUILD=1 packs the binaries already built.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((64 * 1024 * 1024))
mkdir -p .device/bin .whl

pack_bin() {
    local from=$1 name=$2
    strip -o ".device/bin/$name" "$from"
    xz -9e -T0 -f ".device/bin/$name"
    echo "$name: $(stat -c %s "$from") B built, $(stat -c %s ".device/bin/$name.xz") B carried"
}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release -p xtask --features fusion
fi
pack_bin target/release/xtask xtask-fusion
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release -p xtask --features cuda
fi
pack_bin target/release/xtask xtask-cuda
alloc_test=$(cargo test --release -p trainmem-alloc --features cuda --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda_device":
        print(m["executable"])')
[ -n "$alloc_test" ] || { echo "error: the allocator's CUDA test did not build" >&2; exit 1; }
pack_bin "$alloc_test" alloc-cuda-test

# litgpt, at the version the recordings pin
litgpt=$(sed -n 's/^litgpt==//p' validation/pytorch/requirements-nodeps.txt)
if ! ls .whl/litgpt-"$litgpt"-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform any -d .whl "litgpt==$litgpt"
fi

# what travels: tracked files, untracked files git does not ignore, and the carried folders
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}')
carried=$(find .device .whl -type f -print0 | xargs -0 stat -c %s | awk '{s += $1} END {print s + 0}')
total=$((tree + carried))
echo "travels: working tree $tree B + carried $carried B = $total B of $limit B ($((total * 100 / limit))%)"
if [ "$total" -gt "$limit" ]; then
    echo "error: over the device call's limit; carry less (SKIP fusion: rm .device/bin/xtask-fusion.xz)" >&2
    exit 1
fi
cat <<'EOF'
On a lent GPU, one call (device time is short: run it first, nothing else before it):
  run(command: "OUT=$OUT scripts/device-check.sh", carry: [".device", ".whl"], timeout_s: 540)
then, here, for each archive it brought back: tar -xJf FILE (at the repository root), and
commit fixtures/gpu-check/<device>/, fixtures/pytorch-cuda/<device>/ and
fixtures/pytorch-profiled/<device>/ with the device's name.
EOF
