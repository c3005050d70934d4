#!/bin/sh
# The GPU suite in one command: `record.py --suite cuda` (sequence 1024: eager and sdpa
# attention, f32 with foreach and fused AdamW, torch.autocast to bf16, a model cast to bf16,
# LoRA; transformers' LLaMA and GPT-2, the hand-written GPT, litgpt's model) with a ledger per
# run, the caching allocator's figures per phase and its memory snapshot per run, into
# OUT/<gpu name>/ (default fixtures/pytorch-cuda/). `cargo xtask validate pytorch` reads them.
# Before it, cuBLAS's workspaces measured in a fresh process (OUT/<gpu name>/probes/); after
# it, the live storages at each phase's peak of the runs the twin misses (OUT/explain-*.txt),
# and explain's ground truth (profile_truth.py into PROFILED, default fixtures/pytorch-profiled).
#
# Usage, from the repository root of a machine with a GPU and PyTorch:
#     sh validation/pytorch/record_cuda.sh [OUT]
# DEVICE=cpu runs the same suite on the CPU (no allocator figures or snapshots), which is how
# it is checked without a GPU; STEPS=N records N optimizer steps (default 3); PYTHON picks the
# interpreter (default python3). Packages missing on the machine can travel as wheels in
# .whl/ (litgpt is pure Python): they are installed into a folder of their own first.
set -eu
out=${1:-fixtures/pytorch-cuda}
device=${DEVICE:-cuda}
python=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --upgrade \
        --target /tmp/trainmem-site .whl/*.whl
    PYTHONPATH=/tmp/trainmem-site${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH
fi
"$python" -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "cuda", torch.cuda.is_available())'
snapshots=""
if [ "$device" = cuda ]; then
    snapshots=--snapshots
fi
start=$(date +%s)
if [ "$device" = cuda ]; then
    # cuBLAS's workspaces, in a process of its own that has not used CUDA yet (the twin
    # models 32 MiB per thread on compute capability 9.0, 1 MiB more for cuBLASLt)
    "$python" validation/pytorch/record.py --device cuda --probe-blas --out "$out"
fi
# each run in a process of its own, as a training script runs: an earlier run's CUDA context
# and cuBLAS workspaces are not left in the caching allocator for the next
"$python" validation/pytorch/record.py --suite cuda --device "$device" $snapshots \
    --steps "${STEPS:-3}" --fresh-process --out "$out"
# the storages live at the highest total of each phase (the op that made each, its dtype
# and shape) of the autocast runs, whose activations the twin came to predict from such
# lists, to read beside the allocator's snapshots (not read by `cargo xtask validate`)
for run in autocast-gpt2-small-sdpa-adamw-fused autocast-handwritten-gpt-small-sdpa-adamw-fused \
    lora-autocast-llama-small-sdpa-adamw; do
    "$python" validation/pytorch/record.py --suite cuda --device "$device" --steps 1 \
        --only "$run" --explain "$run" --out /tmp/trainmem-explain 2> "$out/explain-$run.txt" \
        || echo "explain $run failed (see $out/explain-$run.txt)"
done
# `trainmem explain`'s ground truth: runs of the suite profiled by torch.profiler's memory
# profiler, each category beside the allocator's snapshot of the same run
# (`cargo xtask validate profiler` reads them from fixtures/pytorch-profiled/<gpu name>/)
"$python" validation/pytorch/profile_truth.py --device "$device" \
    --out "${PROFILED:-fixtures/pytorch-profiled}" || echo "profile_truth.py failed"
echo "recorded in $(( $(date +%s) - start )) s"
