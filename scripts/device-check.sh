#!/usr/bin/env bash
# Everything a lent GPU should show, in one command that runs from carried binaries (nothing is
# compiled there) and brings its results back in the few files a device call returns.
#
# Prepare it here with scripts/device-bundle.sh (it builds the binaries, compresses them into
# .device/bin/ and the litgpt wheel into .whl/, and prints the call to make). On the GPU
# machine, from the repository root:
#
#     scripts/device-check.sh                 # OUT=$OUT, about 7 minutes on an H100
#
# In order of what matters most, each stage packed into $OUT as soon as it ends (so a run cut
# short still brings back what it finished):
#   1. gpu-check.tar.xz: `xtask gpu-check --backend cuda` (every training scenario measured on
#      burn-on-CUDA beside its twin, the tracker against cubecl's bytes in use, cubecl's pools)
#      and the allocator's CUDA test, as scripts/gpu-check.sh runs them;
#   2. pytorch-cuda.tar.xz (and -2, -3 ... when large): validation/pytorch/record_cuda.sh, the
#      PyTorch suite's ledgers, probes and explain listings, and torch.profiler's truth;
#      pytorch-snapshots*.tar.xz: the allocator's snapshots of those runs, as many as fit;
#   3. gpu-check-fusion.tar.xz: the same check built with burn's fusion.
# log.txt holds every stage's output. Unpack each archive at the repository root here
# (`tar -xJf FILE`) and commit what it wrote under fixtures/.
#
# Without a GPU the same script runs end to end on the CPU (how it is checked):
#     BACKEND=flex DEVICE=cpu PYTHON=.venv/bin/python OUT=/tmp/out scripts/device-check.sh
# BACKEND: gpu-check's backend (cuda); DEVICE: record_cuda.sh's (cuda); PYTHON: the
# interpreter holding torch (python3); BUDGET: seconds the whole script may take (480), a stage
# is skipped when less than it needs is left; STAGES: which stages run (default "1 2 3").
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

out=${OUT:?set OUT to the folder whose files come back}
backend=${BACKEND:-cuda}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
budget=${BUDGET:-480}
stages=${STAGES:-1 2 3}
start=$(date +%s)
mkdir -p "$out"
log="$out/log.txt"
: >"$log"
status=0

say() { echo "[device-check $(( $(date +%s) - start )) s] $*" | tee -a "$log"; }
left() { echo $(( budget - ($(date +%s) - start) )); }
# run a stage's command with what is left of the budget, its output in the log
run_logged() {
    local secs=$1; shift
    timeout --signal=TERM --kill-after=10 "$secs" "$@" 2>&1 | tee -a "$log"
    return "${PIPESTATUS[0]}"
}
pack() {
    "$python" scripts/device_pack.py --root "$work" --out "$out" "$@" 2>&1 | tee -a "$log"
}

# the binaries: carried compressed in .device/bin/ (scripts/device-bundle.sh), or built here
bin=/tmp/trainmem-bin
mkdir -p "$bin"
unpack() {
    local name=$1
    if [ -f ".device/bin/$name.xz" ]; then
        if command -v xz >/dev/null; then
            xz -dc ".device/bin/$name.xz" >"$bin/$name"
        else
            "$python" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
                ".device/bin/$name.xz" "$bin/$name"
        fi
        chmod +x "$bin/$name"
        echo "$bin/$name"
    fi
}
xtask=${XTASK:-$(unpack xtask-cuda)}
xtask=${xtask:-target/release/xtask}
xtask_fusion=${XTASK_FUSION:-$(unpack xtask-fusion)}
alloc_test=${ALLOC_TEST:-$(unpack alloc-cuda-test)}
say "backend $backend, device $device, budget $budget s, stages: $stages"
say "xtask: $xtask; fused: ${xtask_fusion:-none}; allocator test: ${alloc_test:-none}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$log"

# everything is written under a work folder and packed with paths relative to it, so the
# archives unpack at the repository root (the committed fixtures here are not touched)
work=$(mktemp -d /tmp/trainmem-device.XXXXXX)
mkdir -p "$work/fixtures/gpu-check" "$work/fixtures/pytorch-cuda" "$work/fixtures/pytorch-profiled"

# the PyTorch runs whose peak reserved bytes the twin misses (crates/sim/tests/
# pytorch_validation.rs, GPU_MISSES): their snapshots are packed first
misses='autocast-gpt2-small-sdpa|autocast-llama-small-sdpa|bf16-llama|litgpt-llama-small-adamw-fused|lora-autocast-llama'

gpu_check() {
    local x=$1 name=$2 need=$3
    if [ ! -x "$x" ]; then
        say "$name: no binary ($x), skipped"; status=1; return
    fi
    if [ "$(left)" -lt "$need" ]; then
        say "$name: skipped, $(left) s left of the budget, it needs about $need s"; status=1; return
    fi
    local before
    before=$(ls "$work/fixtures/gpu-check")
    run_logged "$(left)" "$x" gpu-check --backend "$backend" --out "$work/fixtures/gpu-check" || status=1
    local dir
    dir=$(comm -13 <(echo "$before") <(ls "$work/fixtures/gpu-check") | head -n 1)
    if [ -z "$dir" ]; then
        say "$name: wrote no device folder"; status=1; return
    fi
    if [ "$name" = gpu-check ]; then
        if [ -n "$alloc_test" ] && [ -x "$alloc_test" ]; then
            run_logged "$(( $(left) > 60 ? 60 : $(left) ))" "$alloc_test" --nocapture \
                >"$work/fixtures/gpu-check/$dir/alloc-cuda.txt" || status=1
        else
            say "the allocator's CUDA test binary is missing"
        fi
    fi
    pack --name "$name" "fixtures/gpu-check/$dir"
    say "$name: done ($dir)"
}

for stage in $stages; do
    case $stage in
    1) gpu_check "$xtask" gpu-check 150 ;;
    2)
        if [ "$(left)" -lt 150 ]; then
            say "record_cuda.sh: skipped, $(left) s left"; status=1; continue
        fi
        DEVICE=$device PYTHON=$python PROFILED="$work/fixtures/pytorch-profiled" \
            run_logged "$(( $(left) - 20 ))" sh validation/pytorch/record_cuda.sh \
            "$work/fixtures/pytorch-cuda" || status=1
        # the allocator's snapshots apart: large, so the ledgers come first, then the
        # snapshots of the runs the twin misses, then the others, as many as fit
        (cd "$work" && find fixtures/pytorch-cuda fixtures/pytorch-profiled -type f ! -name '*.pickle' \
            -o -path 'fixtures/pytorch-profiled/*' -type f) | sort >"$work/ledgers.txt"
        # shellcheck disable=SC2046
        pack --name pytorch-cuda $(cat "$work/ledgers.txt")
        (cd "$work" && find fixtures/pytorch-cuda -name '*.pickle' | sort) >"$work/snapshots.txt"
        if [ -s "$work/snapshots.txt" ]; then
            # shellcheck disable=SC2046
            pack --name pytorch-snapshots $(grep -E "$misses" "$work/snapshots.txt") \
                $(grep -v -E "$misses" "$work/snapshots.txt")
        fi
        say "record_cuda.sh: done"
        ;;
    3)
        if [ -n "$xtask_fusion" ]; then
            gpu_check "$xtask_fusion" gpu-check-fusion 150
        else
            say "gpu-check-fusion: no fused binary carried, skipped"
        fi
        ;;
    *) say "unknown stage $stage"; status=1 ;;
    esac
done
say "finished, exit $status; files to bring back:"
ls -la "$out" | tee -a "$log"
rm -rf "$work"
exit $status
