"""Ground truth for `trainmem explain SNAPSHOT`: training runs of the recorded suite profiled by
torch.profiler's memory profiler, every allocation with the category PyTorch itself gives it,
beside a memory snapshot of the same run.

For each run it writes two files into OUT (a folder named after the device inside it):

* `NAME.pickle`: the run's memory snapshot, in the format of
  `torch.cuda.memory._dump_snapshot`. On a GPU (`--device cuda`) it is the caching
  allocator's own, recorded with `_record_memory_history()` (its default, `stacks="all"`:
  Python and C++ frames, as a user records it) alongside the profiler. The CPU has no caching allocator and no snapshot, so on the CPU it is written from
  the profiler's own allocation events: an `alloc` entry per allocation and a
  `free_requested` and `free_completed` per free, each at the address and size the
  profiler recorded, each with the Python frames the profiler's Python tracer saw around it
  (innermost first, file names as the interpreter knows them, as `stacks="python"` records
  them). No segments: the CPU's allocator has none.
* `NAME.truth.json`: for every `alloc` entry of that snapshot, its index among the device
  trace's entries, its size, and the categories `torch.profiler`'s memory profiler gave the
  storage's versions (`parameter`, `gradient`, `optimizer_state`, `activation`, `input`,
  `temporary`, `autograd_detail`, or null where the profiler could not decide); with the
  versions of the packages that recorded it.

The truth also carries, as (first, last) trace entries, the calls the profiler's Python tracer
saw: `forward` (the outermost module calls), `backward` (`Tensor.backward`) and
`optimizer_step` (an optimizer's `step`, any `torch.optim.Optimizer`); on a GPU an entry's time is its matched
allocation's, else the last matched one's before it.

`cargo xtask validate profiler` and the test `explain_agrees_with_torch_profiler_on_every_
profiled_run` read both and compare trainmem's categories with PyTorch's.

Usage, from the repository root:
    python validation/pytorch/profile_truth.py --out fixtures/pytorch-profiled [--device cuda]
"""

import argparse
import bisect
import json
import os
import pickle
import platform
import re
import sys

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import TensorKey

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # noqa: E402  (the suite's model builders)

# runs of the recorded suites, each profiled for its own steps
CPU_RUNS = [
    "mlp-adamw",
    "mlp-sgd",
    "gpt2-tiny-adamw",
    "bert-tiny-sgd",
    "llama-tiny-adamw",
    "gpt2-tiny-adamw-accumulation",
    "llama-tiny-adamw-checkpointing",
    "autocast-mlp-adamw",
    "bf16-llama-tiny-adamw",
    "lora-llama-tiny-adamw",
    "handwritten-gpt-tiny-adamw",
    "gpt2-tiny-adamw-foreach",
    "autocast-gpt2-tiny-adamw",
    "bert-tiny-sgd-checkpointing",
    "lora-gpt2-tiny-adamw",
    "resnet18-adamw",
    "mixtral-tiny-adamw",
    "litgpt-llama-tiny-adamw",
    "llama-tiny-adafactor",
]
CUDA_RUNS = [
    "llama-small-sdpa-adamw-fused",
    "autocast-llama-small-sdpa-adamw-fused",
    "lora-autocast-llama-small-sdpa-adamw",
    "gpt2-small-eager-adamw",
    "handwritten-gpt-small-adamw",
]

CATEGORY_NAMES = {
    "PARAMETER": "parameter",
    "GRADIENT": "gradient",
    "OPTIMIZER_STATE": "optimizer_state",
    "ACTIVATION": "activation",
    "INPUT": "input",
    "TEMPORARY": "temporary",
    "AUTOGRAD_DETAIL": "autograd_detail",
}

PY_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")


def suite_runs(device):
    """The suite's (name, build, optimizer, batch, seq, extra) for the runs profiled."""
    if device == "cuda":
        wanted, suite = CUDA_RUNS, record.cuda_runs()
    else:
        wanted, suite = CPU_RUNS, record.runs()
    found = {entry[0]: entry for entry in suite}
    return [found[name] for name in wanted if name in found]


def train(build, optimizer_name, batch, steps, micro=None, checkpointing=False,
          autocast=None, dtype=None, device="cpu"):
    """The suite's training loop (as `record.record_on` runs it, without the ledger),
    model setup included: `steps` optimizer steps, gradients set to None after each. Returns
    the model and the optimizer, which the caller keeps past the snapshot, as a training
    script dumps its snapshot while both are alive."""
    model, make_batch, loss_of, _ = build()
    if device != "cpu":
        model.to(device)
        make_batch = record.on_device(make_batch, device)
    if dtype is not None:
        model.to(getattr(torch, dtype))
        make_batch = record.cast_floats(make_batch, getattr(torch, dtype))
    model.train()
    if checkpointing:
        model.activation_checkpointing_enable()
    optimizer = record.optimizer_for(optimizer_name, model)
    micro_batches = 1 if micro is None else batch // micro
    for _ in range(steps):
        for _ in range(micro_batches):
            b = make_batch(batch // micro_batches)
            if autocast is None:
                loss = loss_of(model, b)
            else:
                with torch.autocast(device, dtype=getattr(torch, autocast)):
                    loss = loss_of(model, b)
            if micro_batches > 1:
                loss = loss / micro_batches
            loss.backward()
            del loss, b
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return model, optimizer


class Frames:
    """Python frames of a profiler event: the Python tracer's calls around it, innermost
    first, with the file names the interpreter gave them (the profiler shortens a path
    under `sys.path` to the part below it; this finds the file again)."""

    def __init__(self):
        self.paths = {}
        self.stacks = {}

    def path(self, short):
        if short not in self.paths:
            full = short
            if not os.path.isabs(short):
                for root in sys.path:
                    candidate = os.path.join(root or os.getcwd(), short)
                    if os.path.isfile(candidate):
                        full = os.path.abspath(candidate)
                        break
            self.paths[short] = full
        return self.paths[short]

    def of(self, event):
        frames = []
        parent = event.parent
        while parent is not None:
            if parent.typed[0] == _EventType.PyCall:
                m = PY_FRAME.match(parent.name)
                if m:  # not `nn.Module: Linear_0`, the tracer's own marker of a module call
                    frames.append({"filename": self.path(m.group(1)),
                                   "line": int(m.group(2)), "name": m.group(3)})
            parent = parent.parent
        # one list per distinct stack: the pickle writes each once and refers to it after
        return self.stacks.setdefault(tuple(tuple(f.values()) for f in frames), frames)


def allocation_events(prof, device):
    """The profiler's allocation and free events on `device` in time order, with frames."""
    frames = Frames()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] != _EventType.Allocation:
            continue
        f = e.typed[1]
        if f.device.type != device or f.alloc_size == 0:
            continue
        events.append((e.start_time_ns, f.ptr, f.alloc_size, TensorKey.from_allocation(f),
                       frames.of(e)))
    events.sort(key=lambda x: x[0])
    return events


def calls(prof):
    """(start, end) in ns of the calls the Python tracer saw, by kind: `forward`, the
    outermost module calls; `backward`, `Tensor.backward`; `optimizer_step`, an optimizer's
    `step` (a call the tracer records an optimizer with)."""
    found = {"forward": [], "backward": [], "optimizer_step": []}
    stack = [(e, False) for e in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        e, in_module = stack.pop()
        module = e.typed[0] == _EventType.PyCall and e.name.startswith("nn.Module: ")
        stack.extend((c, in_module or module) for c in e.children)
        if e.typed[0] != _EventType.PyCall:
            continue
        span = (e.start_time_ns, e.end_time_ns)
        if module and not in_module:
            found["forward"].append(span)
        m = PY_FRAME.match(e.name)
        if not m:
            continue
        path, name = m.group(1), m.group(3)
        if name == "backward" and path.endswith("torch/_tensor.py"):
            found["backward"].append(span)
        # every torch.optim.Optimizer's `step` (transformers' Adafactor too) runs inside the
        # wrapper torch/optim/optimizer.py puts around it, which calls
        # `_optimizer_step_code`: the call the tracer records the optimizer's state with
        if name == "wrapper" and path.endswith("torch/optim/optimizer.py") and any(
                c.typed[0] == _EventType.PyCall
                and getattr(c.typed[1], "optimizer", None) is not None
                for c in e.children):
            found["optimizer_step"].append(span)
    # an optimizer's `step` wraps the `step` of its class: the outermost of each
    steps = sorted(found["optimizer_step"])
    found["optimizer_step"] = [s for s in steps
                               if not any(o[0] <= s[0] and s[1] <= o[1] and o != s
                                          for o in steps)]
    return {kind: sorted(spans) for kind, spans in found.items()}


def entry_ranges(spans, times):
    """Each span's (first, last) trace entry, from each entry's time in ns (`times`, in
    trace order)."""
    ranges = []
    for start, end in spans:
        first = bisect.bisect_left(times, start)
        last = bisect.bisect_right(times, end) - 1
        if first <= last:
            ranges.append([first, last])
    return ranges


def categories_by_storage(prof):
    """The memory profiler's categories of each storage's versions, in version order, by the
    profiler's key of the storage (`TensorKey`: its id, address and allocation id)."""
    memory = prof._memory_profile()
    versions = {}
    for (key, _), category in memory._category_snapshot().items():
        name = None if category is None else CATEGORY_NAMES[category.name]
        versions.setdefault(key, []).append(name)
    return versions


def cpu_snapshot(events):
    """A snapshot's device trace written from the profiler's allocation events."""
    trace = []
    times = []
    live = {}
    allocs = []
    for t, ptr, size, key, frames in events:
        entry = {"addr": ptr, "stream": 0, "time_us": t // 1000, "frames": frames}
        if size > 0:
            live[ptr] = size
            allocs.append((len(trace), key, size))
            trace.append({"action": "alloc", "size": size, **entry})
            times.append(t)
        elif ptr in live:
            size = live.pop(ptr)
            trace.append({"action": "free_requested", "size": size, **entry})
            trace.append({"action": "free_completed", "size": size, **entry})
            times += [t, t]
    return {"segments": [], "device_traces": [trace]}, allocs, times


def cuda_allocs(snapshot, events):
    """The snapshot's `alloc` entries, each matched to the profiler's allocation at the same
    address in the same order (both see the caching allocator's blocks), and a time for
    every trace entry: that of the profiler's event it matches (an `alloc`, or a
    `free_requested` matched to the profiler's free at its address in the same way), else the
    time of the last matched entry before it."""
    trace = snapshot["device_traces"][0]
    waiting = {"alloc": {}, "free_requested": {}}
    for i, entry in enumerate(trace):
        if entry["action"] in waiting:
            waiting[entry["action"]].setdefault(entry["addr"], []).append(i)
    allocs = []
    at = {}
    for t, ptr, size, key, _ in events:
        queue = waiting["alloc" if size > 0 else "free_requested"].get(ptr)
        if not queue:
            continue
        i = queue.pop(0)
        at[i] = t
        if size > 0:
            allocs.append((i, key, trace[i]["size"]))
    times = []
    last = 0
    for i in range(len(trace)):
        last = max(last, at.get(i, last))
        times.append(last)
    return allocs, times


def profile_run(name, build, opt, batch, seq, extra, steps, device, out):
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    with profile(activities=activities, profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        kept = train(build, opt, batch, steps, device=device, **extra)
    if device == "cuda":
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    del kept
    events = allocation_events(prof, device)
    if device == "cuda":
        allocs, times = cuda_allocs(snapshot, events)
    else:
        snapshot, allocs, times = cpu_snapshot(events)
        # the GPU's matching of the profiler's events to a snapshot's entries, run on this
        # trace, whose entries are the events themselves: it must find them all
        matched, matched_times = cuda_allocs(snapshot, events)
        if matched != allocs or matched_times != times:
            sys.exit(f"{name}: matching the profiler's events to the trace lost some")
    categories = categories_by_storage(prof)
    entries = []
    for index, key, size in allocs:
        entries.append({"alloc_at": index, "size": size,
                        "categories": categories.get(key, [None]) if key else [None]})
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": __import__("transformers").__version__}
    if device == "cuda":
        versions["cuda"] = torch.version.cuda
    truth = {
        "name": name,
        "device": record.device_slug(device) if device == "cuda" else "cpu",
        "optimizer": opt,
        "batch": batch,
        "seq": seq,
        "steps": steps,
        **{k: v for k, v in extra.items()},
        "snapshot": ("the caching allocator's, _record_memory_history() with its default stacks"
                     if device == "cuda" else
                     "written from torch.profiler's allocation events and Python frames"),
        "versions": versions,
        **{kind: entry_ranges(spans, times) for kind, spans in calls(prof).items()},
        "entries": entries,
    }
    with open(os.path.join(out, f"{name}.pickle"), "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    with open(os.path.join(out, f"{name}.truth.json"), "w") as f:
        json.dump(truth, f, indent=None, separators=(",", ":"))
        f.write("\n")
    decided = sum(e["size"] for e in entries if any(c is not None for c in e["categories"]))
    total = sum(e["size"] for e in entries)
    print(f"{name}: {len(snapshot['device_traces'][0])} trace entries, {len(entries)} "
          f"allocations, {total} B, {decided} B categorized by torch.profiler",
          file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", default=None, help="profile only runs whose name contains this")
    args = parser.parse_args()
    out = args.out
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: no GPU is visible to torch")
        out = os.path.join(out, record.device_slug("cuda"))
    else:
        out = os.path.join(out, "cpu")
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    runs = suite_runs(args.device)
    if not runs:
        sys.exit("none of the profiled runs is in the suite")
    for name, build, opt, batch, seq, extra in runs:
        if args.only and args.only not in name:
            continue
        torch.manual_seed(0)
        profile_run(name, build, opt, batch, seq, extra, args.steps, args.device, out)


if __name__ == "__main__":
    main()
