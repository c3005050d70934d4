#!/usr/bin/env python3
"""Does a memory-snapshot pickle open in PyTorch's own command-line viewer?

Runs ``python -m torch.cuda._memory_viz stats PICKLE`` and ``python -m torch.cuda._memory_viz
trace PICKLE`` with the Python that runs this script, prints a few lines of what each printed,
and exits 0 only if both succeeded. Not part of CI: it needs torch.

Set-up (a CPU wheel is enough: the viewer never touches a GPU), outside the repository or in
an ignored directory, never committed:

    python3 -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    # where that index cannot be reached, the PyPI wheel works too (larger: CUDA libraries)
    /work/venv-torch/bin/pip install torch

Use:

    cargo run -p trainmem -- simulate fixtures/plans/gpt2-small.toml --out /tmp/o
    /work/venv-torch/bin/python validation/pytorch/memviz_check.py /tmp/o/memory_viz.pickle

The other views (``segments``, ``memory``) need ``flamegraph.pl``, which torch downloads, and
``compare`` is broken in torch itself for current snapshots, so they are not run. The web
viewer (pytorch.org/memory_viz) is a separate check: it needs the "unknown" category that
trainmem's writer adds (see trainmem_alloc::pytorch::MemorySnapshot::needs_unknown_category).
"""

import importlib.util
import subprocess
import sys

VIEWS = ("stats", "trace")
SHOWN_LINES = 6


def run_view(view: str, path: str) -> bool:
    cmd = [sys.executable, "-m", "torch.cuda._memory_viz", view, path]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout.splitlines()
    ok = proc.returncode == 0 and len(out) > 0
    print(f"$ python -m torch.cuda._memory_viz {view} {path}")
    print(f"  exit {proc.returncode}, {len(out)} lines of output")
    for line in out[:SHOWN_LINES]:
        print(f"  | {line[:160]}")
    if len(out) > SHOWN_LINES:
        print(f"  | ... ({len(out) - SHOWN_LINES} more)")
    if not ok:
        for line in proc.stderr.splitlines()[-SHOWN_LINES:]:
            print(f"  ! {line[:200]}")
    return ok


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} PICKLE", file=sys.stderr)
        return 2
    path = sys.argv[1]
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed for this Python; see the set-up in this file's header",
              file=sys.stderr)
        return 2
    results = {view: run_view(view, path) for view in VIEWS}
    summary = ", ".join(f"{v} {'ok' if ok else 'FAILED'}" for v, ok in results.items())
    verdict = "ok" if all(results.values()) else "FAIL"
    print(f"memviz_check {path}: {verdict} ({summary})")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
