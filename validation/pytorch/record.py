"""Record exact per-category memory ledgers of real PyTorch training runs on CPU.

trainmem's validation suite: each run trains a real model for a few steps on the CPU (where
PyTorch allocates every tensor storage at its exact size, with no caching allocator in
between) and records, at every phase boundary, the live bytes per trainmem category and the
peak of all live bytes since the previous boundary. The ledgers are committed under
`fixtures/pytorch/` and compared with the simulator's predictions by
`cargo xtask validate pytorch`, which needs no Python.

How bytes are counted: a TorchDispatchMode sees every operator's outputs; each new storage is
entered in the ledger with the phase that created it and leaves it when the storage object is
finalised. Categories are assigned at each boundary by identity: parameters, their `.grad`,
the optimizer's state tensors, the batch (input); the remaining live storages are activations
when forward created them and temporaries otherwise. Allocations a kernel makes and frees
inside itself are not seen (none of the models here rely on such scratch for their peak).

Mixed precision: the `autocast-*` runs compute their loss inside
`torch.autocast("cpu", dtype=torch.bfloat16)` (forward and loss inside the region, backward
and the optimizer step outside it, as PyTorch recommends); their ledgers carry an `autocast`
field with the device type and dtype. Parameters stay f32; the half-precision copies autocast
makes of them are storages like any other.

The `autocast-f16-*` runs do the same with `torch.float16` (on the CPU autocast runs the same
ops in half precision for either dtype: their ledgers equal the bf16 runs' byte for byte).

8-bit AdamW (`*-adamw8bit`): bitsandbytes' `AdamW8bit` with its CPU backend. Its step is a
custom operator (`bitsandbytes::optimizer_update_8bit_blockwise`) whose CPU kernel is Python
over aten ops; the ledger calls that kernel with itself re-entered, so the f32 tensors the
step dequantizes into and frees are seen like any other. The two quantization maps the
optimizer makes when it is constructed and shares between parameters (`name2qmap`) are
counted as optimizer state from the start.

`--explain NAME` prints, for one run, the storages live at the highest total of each phase (the
op that made each, its dtype, shape and the phase that made it), which is how the twin's
discrepancies are found: set the list beside the twin's tensors at the same moment.

LoRA runs (`lora-*`) wrap the same models with peft: the base model is frozen
(`requires_grad = False`), rank-8 adapters are added on the named projections (GPT-2's packed
`c_attn`, LLaMA's `q_proj` and `v_proj`, or every linear layer of a block), and the optimizer
is given the trainable parameters alone. The ledger counts the frozen weights as parameters;
only the adapters have gradients and optimizer state.

Usage (from the repository root, in a virtual environment with requirements.txt installed):

    python validation/pytorch/record.py --out fixtures/pytorch
    python validation/pytorch/record.py --out /tmp/x --only autocast-gpt2 --explain autocast-gpt2-tiny-adamw

Mixtures of experts (`mixtral-*`, `qwen2-moe-*`): transformers' own `MixtralForCausalLM` and
`Qwen2MoeForCausalLM` built from small configs (4 or 8 experts, top-2; Qwen2-MoE's gated
shared expert), their experts run by transformers' default `grouped_mm` implementation.

torchvision's own ResNet-18 (`tv-resnet18-*`, beside the plain-nn `resnet18-*`) is recorded
when torchvision is importable (requirements.txt pins it):

    python validation/pytorch/record.py --out fixtures/pytorch --only tv-resnet18
"""

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CATEGORIES = ["parameter", "gradient", "optimizer_state", "activation", "input", "temporary"]


class Ledger(TorchDispatchMode):
    """Every storage an operator creates, with the phase that created it."""

    def __init__(self, device="cpu", fake=False):
        super().__init__()
        # the device whose storages are counted (a CUDA run's CPU tensors are not)
        self.device = device
        # on fake tensors (`--device fake-cuda`): storages have no memory, so no data
        # pointer; each is known by its storage object instead, and there is no allocator
        self.fake = fake
        self.live = {}  # storage key -> (nbytes, phase)
        self.total = 0
        self.peak = 0
        self.phase = "start"
        # for --explain: what made each live storage, and the live set at the highest total
        self.explain = False
        self.made_by = {}  # storage key -> (op, dtype, shape)
        self.highest = {}  # phase -> highest total while it ran
        self.at_highest = {}  # phase -> the live set then

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "bitsandbytes":
            # bitsandbytes' CPU kernels are Python functions over aten ops (dequantize to
            # f32, update, quantize back): their CPU kernel is called with the mode
            # re-entered so that the storages they make and free inside the step are seen too
            with self:
                out = func.redispatch(
                    torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.enter(t, str(func))
        return out

    def key(self, t):
        """The identity of `t`'s storage: its data pointer (0: no memory), or on fake
        tensors the storage object's own address."""
        storage = t.untyped_storage()
        return storage._cdata if self.fake else storage.data_ptr()

    def enter(self, t, op="(given)"):
        if t.device.type != self.device:
            return
        storage = t.untyped_storage()
        ptr = self.key(t)
        if ptr == 0 or ptr in self.live:
            return
        n = storage.nbytes()
        self.live[ptr] = (n, self.phase)
        self.total += n
        self.peak = max(self.peak, self.total)
        if self.explain:
            self.made_by[ptr] = (op, str(t.dtype).replace("torch.", ""), tuple(t.shape))
            if self.total > self.highest.get(self.phase, 0):
                self.highest[self.phase] = self.total
                self.at_highest[self.phase] = {
                    p: (e, self.made_by.get(p)) for p, e in self.live.items()}
        weakref.finalize(storage, self.leave, ptr, n)

    def leave(self, ptr, n):
        entry = self.live.get(ptr)
        if entry is not None and entry[0] == n:
            del self.live[ptr]
            self.total -= n

    def sample(self, phase, step, model, optimizer, batch):
        """Live bytes per category now, and the peak since the previous sample."""
        owner = {}

        def claim(tensor, category):
            if tensor is None:
                return
            self.enter(tensor)
            owner.setdefault(self.key(tensor), category)

        for p in model.parameters():
            claim(p, "parameter")
        for p in model.parameters():
            claim(p.grad, "gradient")
        for v in optimizer_tensors(optimizer):
            claim(v, "optimizer_state")
        for t in batch:
            claim(t, "input")
        bytes_by = dict.fromkeys(CATEGORIES, 0)
        for ptr, (n, created) in self.live.items():
            category = owner.get(ptr)
            if category is None:
                category = "activation" if created == "forward" else "temporary"
            bytes_by[category] += n
        record = {
            "phase": phase,
            "step": step,
            "categories": bytes_by,
            "total": self.total,
            "peak_since_previous": max(self.peak, self.total),
        }
        self.peak = self.total
        if self.device == "cuda" and not self.fake:
            # the caching allocator's own figures: allocated (block sizes, rounded; the
            # cuBLAS workspace included), reserved (segments), and their peaks since the
            # previous sample
            torch.cuda.synchronize()
            record["cuda"] = {
                "allocated": torch.cuda.memory_allocated(),
                "reserved": torch.cuda.memory_reserved(),
                "peak_allocated": torch.cuda.max_memory_allocated(),
                "peak_reserved": torch.cuda.max_memory_reserved(),
            }
            torch.cuda.reset_peak_memory_stats()
        return record


FAKE_CUDA = {
    "name": "fake-cuda",
    "how": "PyTorch's FakeTensorMode on the CPU: CUDA's dispatch (autocast's CUDA op lists, "
           "the CUDA kernels' output shapes and dtypes, autograd's saved tensors) without a "
           "GPU; scaled_dot_product_attention's kernel chosen as on compute capability 9.0",
}


def sdpa_as_on_a_gpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False):
    """`scaled_dot_product_attention` on fake CUDA tensors, with the kernel PyTorch picks on
    a GPU of compute capability 9.0 (fake tensors have no device to ask, so PyTorch's own
    choice falls back to the math path): flash attention for half-precision inputs without
    a mask and heads of at most 256 (a multiple of 8), else the memory-efficient kernel
    (f32 too, masks, dropout; not grouped key/value heads), else the math path. Under
    autocast the inputs are cast first, as autocast casts this op's."""
    if torch.is_autocast_enabled("cuda"):
        half = torch.get_autocast_dtype("cuda")
        query, key, value = (x.to(half) if x.is_floating_point() else x
                             for x in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(half)
    d = query.shape[-1]
    halves = (torch.float16, torch.bfloat16)
    same = query.dtype == key.dtype == value.dtype
    if same and query.dtype in halves and attn_mask is None and d <= 256 and d % 8 == 0:
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, scale=scale)[0]
    grouped = enable_gqa and key.shape[-3] != query.shape[-3]
    if same and not grouped and d % (8 if query.dtype in halves else 4) == 0:
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # the kernel takes an additive mask: PyTorch converts a boolean one first
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill_(
                attn_mask.logical_not(), float("-inf"))
        if attn_mask is not None:
            shape = (*query.shape[:-1], key.shape[-2])
            attn_mask = attn_mask.expand(shape)
        grad = torch.is_grad_enabled() and any(
            x.requires_grad for x in (query, key, value))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, grad, dropout_p, is_causal, scale=scale)[0]
    return SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


SDPA = torch.nn.functional.scaled_dot_product_attention


@contextlib.contextmanager
def fake_cuda():
    """Runs what it wraps on fake CUDA tensors (`--device fake-cuda`): new tensors on the
    fake GPU by default, real CPU tensors given to an op taken in as fake ones,
    `scaled_dot_product_attention` choosing its kernel as on a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    torch.nn.functional.scaled_dot_product_attention = sdpa_as_on_a_gpu
    # code that asks the GPU's compute capability (transformers' grouped experts) is told 9.0
    capability = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    try:
        with mode, torch.device("cuda"):
            yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = SDPA
        torch.cuda.get_device_capability = capability


@contextlib.contextmanager
def fake_cuda_autocast(dtype):
    """`torch.autocast("cuda", dtype)` on fake tensors: `torch.autocast` turns itself off
    without a GPU, so the region is entered as it enters one (enabled, its dtype, one level
    deeper) and left as it leaves one (the weight cache cleared at the outermost level)."""
    was_enabled = torch.is_autocast_enabled("cuda")
    was_dtype = torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", was_enabled)
        torch.set_autocast_dtype("cuda", was_dtype)


def optimizer_tensors(optimizer):
    """The optimizer's state tensors: each parameter's `state`, and the quantization maps an
    8-bit optimizer (bitsandbytes) shares between its parameters (`name2qmap`, made when the
    optimizer is)."""
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                yield v
    for v in getattr(optimizer, "name2qmap", {}).values():
        if isinstance(v, torch.Tensor):
            yield v


def mlp(batch, hidden=(1024, 1024)):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, hidden[0]), torch.nn.ReLU(),
        torch.nn.Linear(hidden[0], hidden[1]), torch.nn.ReLU(),
        torch.nn.Linear(hidden[1], 10),
    )
    def make_batch(n):
        return (torch.randn(n, 784), torch.randint(0, 10, (n,)))
    def loss_of(model, b):
        return torch.nn.functional.cross_entropy(model(b[0]), b[1])
    plan = {"mlp": {"input": 784, "hidden": list(hidden), "output": 10, "loss": "cross_entropy"}}
    return model, make_batch, loss_of, {"plan_model": plan}


def resnet18(batch, image=64, classes=10):
    """ResNet-18 (He et al.: 7×7 stem, max pool, four stages of two basic blocks with
    identity or 1×1-convolution shortcuts, global average pool, linear head) written in plain
    torch.nn, the layout torchvision's `resnet18` has (`tv_resnet18` is torchvision's own), on
    `image`×`image` RGB inputs; with the plan's `[model.layers]` list of the same ops."""
    nn = torch.nn
    torch.manual_seed(0)
    layers = []  # the plan's ops, per sample

    def op(name, out, params=(), **extra):
        layers.append({"op": name, "out": list(out), "params": list(params), **extra})
        return len(layers) - 1

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return self.relu(out)

    def block_ops(block_input, cin, cout, stride, side):
        shape = (cout, side, side)
        op("conv2d", shape, [cout * cin * 9])
        op("batch_norm", shape, [cout, cout])
        op("relu", shape)
        op("conv2d", shape, [cout * cout * 9])
        main = op("batch_norm", shape, [cout, cout])
        if stride != 1 or cin != cout:
            op("conv2d", shape, [cout * cin], **{"from": block_input})
            short = op("batch_norm", shape, [cout, cout])
            op("add", shape, **{"from": main, "with": short})
        else:
            op("add", shape, **{"with": block_input})
        return op("relu", shape)

    stages = []
    side = image // 2
    op("conv2d", (64, side, side), [64 * 3 * 49])
    op("batch_norm", (64, side, side), [64, 64])
    op("relu", (64, side, side))
    side //= 2
    last = op("max_pool2d", (64, side, side))
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        side //= stride
        blocks = [Block(cin, cout, stride), Block(cout, cout, 1)]
        last = block_ops(last, cin, cout, stride, side)
        last = block_ops(last, cout, cout, 1, side)
        stages.append(nn.Sequential(*blocks))
        cin = cout
    op("global_avg_pool", (512, 1, 1))
    op("view", (512,))
    op("linear", (classes,), [512 * classes, classes])
    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *stages, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
        nn.Linear(512, classes),
    )

    def make_batch(n):
        return (torch.randn(n, 3, image, image), torch.randint(0, classes, (n,)))

    def loss_of(model, b):
        return torch.nn.functional.cross_entropy(model(b[0]), b[1])

    plan = {"layers": {"input": [3, image, image], "layers": layers, "loss": "cross_entropy"}}
    return model, make_batch, loss_of, {"plan_model": plan}


def tv_resnet18(batch, image=64, classes=10):
    """torchvision's own `torchvision.models.resnet18(num_classes=classes)` (random weights),
    on the same `image`×`image` inputs and with the same plan as the plain-nn `resnet18`,
    whose layout it is."""
    import torchvision
    _, make_batch, loss_of, described = resnet18(batch, image, classes)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=classes)
    return model, make_batch, loss_of, described


def have_torchvision():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def hf_model(kind, config, batch, seq, attention=None):
    """A `transformers` model of `kind` built from `config` (random weights), its attention
    implementation `attention` (`eager`, `sdpa`; None: what transformers picks)."""
    import transformers
    torch.manual_seed(0)
    if attention is not None:
        config = dict(config, attn_implementation=attention)
    if kind not in ("gpt2", "bert", "llama", "mixtral", "qwen2_moe"):
        # any other family: its configuration class and causal-LM head by model type
        cfg = transformers.AutoConfig.for_model(kind, **config)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    elif kind == "gpt2":
        cfg = transformers.GPT2Config(**config)
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "bert":
        cfg = transformers.BertConfig(**config)
        model = transformers.BertForSequenceClassification(cfg)
    elif kind == "llama":
        cfg = transformers.LlamaConfig(**config)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**config)
        model = transformers.MixtralForCausalLM(cfg)
    elif kind == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(**config)
        model = transformers.Qwen2MoeForCausalLM(cfg)
    vocab = cfg.vocab_size
    def make_batch(n):
        ids = torch.randint(0, vocab, (n, seq))
        if kind == "bert":
            return (ids, torch.randint(0, 2, (n,)))
        # labels as a language-modelling collator makes them: a copy of the ids
        return (ids, ids.clone())
    def loss_of(model, b):
        return model(input_ids=b[0], labels=b[1]).loss
    full = cfg.to_dict()
    full["model_type"] = cfg.model_type
    described = {"hf_config": full}
    if attention is not None:
        described["attn_implementation"] = attention
    return model, make_batch, loss_of, described


def handwritten_gpt(batch, seq, sdpa, vocab=1024, layers=2, width=128, heads=4):
    """The hand-written GPT of `handwritten_gpt.py` (nanoGPT's layout: learned positions,
    layer norms with biases, a packed query-key-value projection, a GELU feed-forward of
    4 × width, a tied head), its layer norm and softmax composed of plain tensor ops, its
    attention eager or `scaled_dot_product_attention` (`sdpa`); next-token targets as
    nanoGPT's loader makes them (a window of seq + 1 tokens, shifted by one)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import handwritten_gpt
    torch.manual_seed(0)
    model = handwritten_gpt.GPT(vocab, seq, layers, width, heads, bias=True, sdpa=sdpa)

    def make_batch(n):
        window = torch.randint(0, vocab, (n, seq + 1))
        return (window[:, :-1].contiguous(), window[:, 1:].contiguous())

    def loss_of(model, b):
        return model(b[0], b[1])

    plan = {"transformer": {
        "kind": "decoder", "layers": layers, "hidden": width, "heads": heads,
        "seq_len": seq, "vocab": vocab, "tied_embeddings": True, "activation": "gelu",
        "norm": "layer_norm", "dropout": 0.0, "learned_positions": True, "bias": True,
        "attention": "sdpa" if sdpa else "eager", "implementation": "handwritten",
    }}
    return model, make_batch, loss_of, {"plan_model": plan}


def litgpt_model(batch, seq, lora=False, groups=2, vocab=1024, layers=2, width=128, heads=4,
                 inner=344):
    """litgpt's own `GPT` (litgpt.model; `litgpt.lora.GPT` with rank-8 adapters on the
    packed projection's query and value parts when `lora`), a LLaMA-like configuration of
    litgpt's (`RMSNorm`, `LLaMAMLP`, grouped-query attention through
    `scaled_dot_product_attention`, rotary positions, no biases, an untied head), trained as
    litgpt's fine-tuning scripts do: the full fine-tune computes all logits and takes
    `chunked_cross_entropy` of the shifted logits (chunks of 128 rows); LoRA computes the
    head in chunks of 128 positions (`lm_head_chunk_size=128`) and the loss over the list of
    chunks (litgpt/finetune/full.py and lora.py). `groups`: key/value heads (4: as many as
    query heads)."""
    from litgpt.utils import chunked_cross_entropy
    if lora:
        from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    else:
        from litgpt.config import Config
        from litgpt.model import GPT
    config = dict(name="llama-tiny", block_size=seq, vocab_size=vocab, padded_vocab_size=vocab,
                  n_layer=layers, n_head=heads, n_embd=width, n_query_groups=groups,
                  rotary_percentage=1.0, parallel_residual=False, bias=False,
                  norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP",
                  intermediate_size=inner)
    if lora:
        config.update(lora_r=8, lora_alpha=16, lora_dropout=0.0, lora_query=True,
                      lora_value=True)
    torch.manual_seed(0)
    model = GPT(Config(**config))
    if lora:
        mark_only_lora_as_trainable(model)

    def make_batch(n):
        ids = torch.randint(0, vocab, (n, seq))
        return (ids, ids.clone())

    def loss_of(model, b):
        if lora:
            logits = model(b[0], lm_head_chunk_size=128)
            logits[-1] = logits[-1][..., :-1, :]
            return chunked_cross_entropy(logits, b[1][..., 1:])
        logits = model(b[0])
        return chunked_cross_entropy(logits[..., :-1, :], b[1][..., 1:])

    plan = {"transformer": {
        "kind": "decoder", "layers": layers, "hidden": width, "heads": heads,
        "kv_heads": groups, "ffn": inner, "gated_ffn": True, "activation": "silu",
        "norm": "rms_norm", "seq_len": seq, "vocab": vocab, "bias": False,
        "attention": "sdpa", "implementation": "litgpt",
    }}
    if lora:
        plan["transformer"]["lora"] = {"rank": 8, "alpha": 16.0, "targets": ["q", "v"],
                                       "dropout": 0.0}
    return model, make_batch, loss_of, {"plan_model": plan}


def have_litgpt():
    try:
        import litgpt  # noqa: F401
    except ImportError:
        return False
    return True


def with_lora(build, lora):
    """`build` with the model wrapped by peft: the base frozen, adapters on `lora["targets"]`
    (peft's module names) of rank `lora["rank"]`."""
    def wrapped():
        import peft
        model, make_batch, loss_of, described = build()
        config = peft.LoraConfig(
            r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
            target_modules=lora["targets"], bias="none",
            # GPT-2's projections are Conv1D modules with the weight stored (in, out)
            fan_in_fan_out=lora.get("fan_in_fan_out", False),
        )
        torch.manual_seed(1)
        model = peft.get_peft_model(model, config)
        described = dict(described)
        described["lora"] = {k: v for k, v in lora.items() if k != "fan_in_fan_out"}
        return model, make_batch, loss_of, described
    return wrapped


def cast_floats(make_batch, dtype):
    """`make_batch` with its floating tensors made in `dtype` (ids and labels stay)."""
    def made(n):
        return tuple(t.to(dtype) if t.is_floating_point() else t for t in make_batch(n))
    return made


def optimizer_for(name, model):
    # only the trainable parameters (all of them, but under LoRA)
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if name == "adamw-foreach":
        return torch.optim.AdamW(params, lr=1e-3, foreach=True)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    if name == "adafactor":
        # transformers' Adafactor: factored second moments (a row and a column vector per
        # matrix), no first moment (beta1 None), a fixed learning rate
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=1e-3, relative_step=False, scale_parameter=False,
                         warmup_init=False)
    if name == "adamw8bit":
        # bitsandbytes' 8-bit AdamW: both moments as one byte per element with an f32 absmax
        # per block of 256, for tensors of at least 4096 elements (min_8bit_size); smaller
        # ones keep f32 moments. Its defaults but the learning rate.
        import bitsandbytes
        return bitsandbytes.optim.AdamW8bit(params, lr=1e-3)
    raise ValueError(name)


def on_device(make_batch, device):
    """`make_batch` with its tensors moved to `device` (made on the CPU, as a loader does)."""
    # `cuda:0`: a fake GPU has no current device to ask
    device = "cuda:0" if device == "cuda" else device
    def made(n):
        return tuple(t.to(device) for t in make_batch(n))
    return made


def record(name, build, optimizer_name, batch, seq, steps, micro=None, checkpointing=False,
           autocast=None, dtype=None, explain=False, device="cpu", snapshot=None):
    """[`record_on`] on `device`: `cpu`, `cuda`, or `fake-cuda` (the GPU's dispatch on fake
    tensors, see [`fake_cuda`]: the ledger's storages of the first forward pass, without the
    allocator's figures)."""
    args = (name, build, optimizer_name, batch, seq, steps, micro, checkpointing, autocast,
            dtype, explain)
    if device != "fake-cuda":
        return record_on(*args, device=device, snapshot=snapshot)
    # the model is built (and cast) as the run builds it but on the meta device (no memory:
    # a published model's full size builds in seconds), then made fake: PyTorch cannot move
    # or cast a fake module in place
    with torch.device("meta"):
        model, make_batch, loss_of, described = build()
        if dtype is not None:
            model.to(getattr(torch, dtype))
    with fake_cuda():
        on_fake_cuda(model)
        args = (name, lambda: (model, make_batch, loss_of, described), *args[2:])
        return record_on(*args, device="cuda", fake=True)


def on_fake_cuda(model):
    """Replaces every parameter and buffer of `model` by a fake CUDA tensor of its shape and
    dtype (inside [`fake_cuda`]), a parameter shared by two modules (tied weights) by one."""
    made = {}
    for module in model.modules():
        for table, wrap in ((module._parameters, True), (module._buffers, False)):
            for key, t in table.items():
                if t is None:
                    continue
                if id(t) not in made:
                    fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                               device="cuda:0")
                    made[id(t)] = (torch.nn.Parameter(fake, requires_grad=t.requires_grad)
                                   if wrap else fake)
                table[key] = made[id(t)]


def record_on(name, build, optimizer_name, batch, seq, steps, micro=None, checkpointing=False,
              autocast=None, dtype=None, explain=False, device="cpu", snapshot=None,
              fake=False):
    """Trains `steps` optimizer steps of `batch` samples, as `batch / micro` accumulated
    micro-batches when `micro` is given, computing the loss under `torch.autocast` to
    `autocast` (a dtype name) when given, with the model cast to `dtype` (a dtype name:
    pure half precision, `model.to(torch.bfloat16)`) when given, and returns the ledger.

    On `device="cuda"` the model is moved to the GPU before the ledger starts and each batch
    is made on the CPU and copied over; the ledger counts the GPU's storages, and each sample
    adds the caching allocator's figures. `snapshot`: a path to dump the allocator's memory
    snapshot (`torch.cuda.memory._dump_snapshot`) of the whole run to."""
    model, make_batch, loss_of, described = build()
    if device != "cpu" and not fake:
        model.to(device)
        make_batch = on_device(make_batch, device)
    if dtype is not None:
        # cast before the ledger starts, as a run loads or casts its model before training:
        # parameters, and so torch.optim's state, are in `dtype`; floating inputs are cast
        # as they are made
        if not fake:  # a fake run's model was cast before it was made fake
            model.to(getattr(torch, dtype))
        make_batch = cast_floats(make_batch, getattr(torch, dtype))
    model.train()
    if optimizer_name == "adafactor":
        # imported before the ledger starts: the import itself makes a 16-byte tensor
        import transformers.optimization  # noqa: F401
    if optimizer_name == "adamw8bit":
        # likewise: bitsandbytes is imported (and its CPU library loaded) outside the ledger
        import bitsandbytes  # noqa: F401
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    if type(model).__module__.startswith("torchvision."):
        versions["torchvision"] = __import__("torchvision").__version__
    if optimizer_name == "adamw8bit":
        versions["bitsandbytes"] = __import__("bitsandbytes").__version__
    if "lora" in described:
        versions["peft"] = __import__("peft").__version__
    if type(model).__module__.startswith("litgpt."):
        versions["litgpt"] = importlib.metadata.version("litgpt")
    if any(not p.requires_grad for p in model.parameters()):
        described = dict(described)
        described["trainable_parameters"] = sum(
            p.numel() for p in model.parameters() if p.requires_grad)
    if checkpointing:
        model.activation_checkpointing_enable()
    micro_batches = 1 if micro is None else batch // micro
    ledger = Ledger(device, fake)
    ledger.explain = explain
    samples = []
    def region():
        if autocast is None:
            return contextlib.nullcontext()
        if fake:
            return fake_cuda_autocast(getattr(torch, autocast))
        return torch.autocast(device, dtype=getattr(torch, autocast))
    if device == "cuda" and not fake:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        if snapshot is not None:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    with ledger:
        optimizer = optimizer_for(optimizer_name, model)
        for p in model.parameters():
            ledger.enter(p)
        samples.append(ledger.sample("model_init", 0, model, optimizer, ()))
        for step in range(steps):
            for _ in range(micro_batches):
                ledger.phase = "batch"
                b = make_batch(batch // micro_batches)
                for t in b:
                    ledger.enter(t)
                samples.append(ledger.sample("batch_loaded", step, model, optimizer, b))
                ledger.phase = "forward"
                with region():
                    loss = loss_of(model, b)
                if micro_batches > 1:
                    loss = loss / micro_batches
                samples.append(ledger.sample("forward", step, model, optimizer, b))
                if fake:
                    # PyTorch's autograd engine asks the GPU for its streams in backward,
                    # which fake tensors cannot answer: a fake run records one forward pass
                    break
                ledger.phase = "backward"
                loss.backward()
                del loss
                samples.append(ledger.sample("backward", step, model, optimizer, b))
            if fake:
                break
            ledger.phase = "optimizer"
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            samples.append(ledger.sample("optimizer_step", step, model, optimizer, b))
            del b
    if device == "cuda" and snapshot is not None:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    if explain:
        explain_peak(name, ledger, model, optimizer)
    described = dict(described)
    if fake:
        described["device"] = {"type": "cuda", "name": FAKE_CUDA["name"], "total_memory": 0,
                               "capability": [9, 0], "fake_tensors": FAKE_CUDA["how"]}
    elif device == "cuda":
        props = torch.cuda.get_device_properties(0)
        described["device"] = {"type": "cuda", "name": props.name,
                               "total_memory": props.total_memory,
                               "capability": [props.major, props.minor]}
        versions["cuda"] = torch.version.cuda
    if autocast is not None:
        described["autocast"] = {"device_type": device, "dtype": autocast}
    if dtype is not None:
        described["dtype"] = dtype
    return {
        "name": name,
        "optimizer": optimizer_name,
        "batch": batch,
        "micro_batch": micro,
        "checkpointing": checkpointing,
        "seq": seq,
        "steps": steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "versions": versions,
        **described,
        "samples": samples,
    }


def explain_peak(name, ledger, model, optimizer):
    """Prints the storages live at the highest total of each phase (forward, backward, the
    optimizer step), largest first."""
    model_state = set()
    for p in model.parameters():
        model_state.add(ledger.key(p))
        if p.grad is not None:
            model_state.add(ledger.key(p.grad))
    for v in optimizer_tensors(optimizer):
        model_state.add(ledger.key(v))
    for during, live in ledger.at_highest.items():
        rows = sorted(live.items(), key=lambda kv: -kv[1][0][0])
        print(f"{name}: {ledger.highest[during]} B live at the highest total during {during}",
              file=sys.stderr)
        other = 0
        for ptr, ((n, phase), made) in rows:
            if ptr in model_state:
                other += n
                continue
            op, dtype, shape = made or ("?", "?", ())
            print(f"  {n:>10} {phase:<9} {dtype:<9} {str(list(shape)):<18} {op}",
                  file=sys.stderr)
        print(f"  {other:>10} parameters, gradients and optimizer state (live at the end)",
              file=sys.stderr)


def runs():
    tiny_gpt2 = dict(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=128)
    tiny_bert = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                     intermediate_size=512, vocab_size=1024, max_position_embeddings=128)
    tiny_llama = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=344, vocab_size=1024,
                      max_position_embeddings=128, tie_word_embeddings=False)
    gpt2 = lambda: hf_model("gpt2", tiny_gpt2, 4, 64)  # noqa: E731
    bert = lambda: hf_model("bert", tiny_bert, 4, 64)  # noqa: E731
    llama = lambda: hf_model("llama", tiny_llama, 4, 64)  # noqa: E731
    for opt in ["sgd", "adamw"]:
        yield f"mlp-{opt}", (lambda: mlp(32)), opt, 32, 0, {}
        yield f"gpt2-tiny-{opt}", gpt2, opt, 4, 64, {}
        yield f"bert-tiny-{opt}", bert, opt, 4, 64, {}
        yield f"llama-tiny-{opt}", llama, opt, 4, 64, {}
    # variants: the foreach AdamW step, gradient accumulation, Hugging Face checkpointing
    yield "mlp-adamw-foreach", (lambda: mlp(32)), "adamw-foreach", 32, 0, {}
    yield "gpt2-tiny-adamw-foreach", gpt2, "adamw-foreach", 4, 64, {}
    yield "gpt2-tiny-adamw-accumulation", gpt2, "adamw", 4, 64, {"micro": 2}
    yield "llama-tiny-adamw-checkpointing", llama, "adamw", 4, 64, {"checkpointing": True}
    yield "bert-tiny-sgd-checkpointing", bert, "sgd", 4, 64, {"checkpointing": True}
    # LLaMA with transformers' eager attention (attn_implementation="eager"): the keys and
    # values repeated to every query head (grouped-query attention) for its matmuls
    llama_eager = lambda: hf_model("llama", tiny_llama, 4, 64, "eager")  # noqa: E731
    yield "llama-tiny-eager-adamw", llama_eager, "adamw", 4, 64, {}
    # BERT-large (bert-large-uncased's shape) at sequence 512 and batch 8, the largest batch
    # whose training the twin predicts to fit this 24 GiB machine (19.6 GiB; batch 9: 21.6 GiB)
    large_bert = dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                      intermediate_size=4096, vocab_size=30522, max_position_embeddings=512)
    yield "bert-large-seq512-adamw", (lambda: hf_model("bert", large_bert, 8, 512)), \
        "adamw", 8, 512, {}
    # torch.autocast to bf16 on the CPU: every model with AdamW, GPT-2 and the MLP with SGD
    bf16 = {"autocast": "bfloat16"}
    yield "autocast-mlp-adamw", (lambda: mlp(32)), "adamw", 32, 0, bf16
    yield "autocast-mlp-sgd", (lambda: mlp(32)), "sgd", 32, 0, bf16
    yield "autocast-gpt2-tiny-adamw", gpt2, "adamw", 4, 64, bf16
    yield "autocast-gpt2-tiny-sgd", gpt2, "sgd", 4, 64, bf16
    yield "autocast-bert-tiny-adamw", bert, "adamw", 4, 64, bf16
    yield "autocast-llama-tiny-adamw", llama, "adamw", 4, 64, bf16
    yield "autocast-gpt2-tiny-adamw-checkpointing", gpt2, "adamw", 4, 64, {
        **bf16, "checkpointing": True}
    # LoRA through peft: frozen base, rank-8 adapters (alpha 16)
    gpt2_lora = with_lora(gpt2, {"rank": 8, "alpha": 16, "dropout": 0.1,
                                 "targets": ["c_attn"], "fan_in_fan_out": True})
    llama_qv = with_lora(llama, {"rank": 8, "alpha": 16, "dropout": 0.0,
                                 "targets": ["q_proj", "v_proj"]})
    llama_all = with_lora(llama, {"rank": 8, "alpha": 16, "dropout": 0.05,
                                  "targets": ["q_proj", "k_proj", "v_proj", "o_proj",
                                              "gate_proj", "up_proj", "down_proj"]})
    for opt in ["sgd", "adamw"]:
        yield f"lora-gpt2-tiny-{opt}", gpt2_lora, opt, 4, 64, {}
        yield f"lora-llama-tiny-{opt}", llama_qv, opt, 4, 64, {}
    yield "lora-llama-tiny-all-adamw", llama_all, "adamw", 4, 64, {}
    # ResNet-18 in plain torch.nn (torchvision's layout), 64×64 images
    yield "resnet18-sgd", (lambda: resnet18(8)), "sgd", 8, 0, {}
    yield "resnet18-adamw", (lambda: resnet18(8)), "adamw", 8, 0, {}
    # torchvision's own ResNet-18 (pinned in requirements.txt), the same images and batch
    if have_torchvision():
        yield "tv-resnet18-sgd", (lambda: tv_resnet18(8)), "sgd", 8, 0, {}
        yield "tv-resnet18-adamw", (lambda: tv_resnet18(8)), "adamw", 8, 0, {}
    else:
        print("torchvision is not installed: tv-resnet18-* not recorded "
              "(validation/pytorch/requirements.txt)", file=sys.stderr)
    # Adafactor (transformers)
    yield "mlp-adafactor", (lambda: mlp(32)), "adafactor", 32, 0, {}
    yield "gpt2-tiny-adafactor", gpt2, "adafactor", 4, 64, {}
    yield "llama-tiny-adafactor", llama, "adafactor", 4, 64, {}
    # bitsandbytes' 8-bit AdamW (its CPU backend)
    yield "mlp-adamw8bit", (lambda: mlp(32)), "adamw8bit", 32, 0, {}
    yield "gpt2-tiny-adamw8bit", gpt2, "adamw8bit", 4, 64, {}
    yield "llama-tiny-adamw8bit", llama, "adamw8bit", 4, 64, {}
    # hidden 1000: no weight is a whole number of 256-element blocks (784 000, 1 000 000 and
    # 10 000 elements), and the biases (1000, 10) stay f32
    yield "mlp1000-adamw8bit", (lambda: mlp(32, (1000, 1000))), "adamw8bit", 32, 0, {}
    # LoRA adapters (rank 8 on 128-wide projections: 1024 and 512 elements) are all under
    # min_8bit_size: f32 moments and the step of bitsandbytes' 32-bit kernel
    yield "lora-llama-tiny-adamw8bit", llama_qv, "adamw8bit", 4, 64, {}
    # pure half precision: the model cast with .to(torch.bfloat16), torch.optim's AdamW
    # keeping both moments in the parameters' dtype (bf16), no f32 master weights
    pure_bf16 = {"dtype": "bfloat16"}
    yield "bf16-mlp-adamw", (lambda: mlp(32)), "adamw", 32, 0, pure_bf16
    yield "bf16-gpt2-tiny-adamw", gpt2, "adamw", 4, 64, pure_bf16
    yield "bf16-llama-tiny-adamw", llama, "adamw", 4, 64, pure_bf16
    # a GPT written by hand (validation/pytorch/handwritten_gpt.py): composed layer norm and
    # softmax, eager attention or scaled_dot_product_attention
    hw = lambda: handwritten_gpt(4, 64, sdpa=False)  # noqa: E731
    hw_sdpa = lambda: handwritten_gpt(4, 64, sdpa=True)  # noqa: E731
    for opt in ["sgd", "adamw"]:
        yield f"handwritten-gpt-tiny-{opt}", hw, opt, 4, 64, {}
        yield f"handwritten-gpt-tiny-sdpa-{opt}", hw_sdpa, opt, 4, 64, {}
    # litgpt's own models (litgpt from the package index): full fine-tune and LoRA, its
    # chunked cross-entropy
    if have_litgpt():
        lit = lambda: litgpt_model(4, 64)  # noqa: E731
        lit_lora = lambda: litgpt_model(4, 64, lora=True)  # noqa: E731
        yield "litgpt-llama-tiny-adamw", lit, "adamw", 4, 64, {}
        yield "litgpt-llama-tiny-sgd", lit, "sgd", 4, 64, {}
        yield "lora-litgpt-llama-tiny-adamw", lit_lora, "adamw", 4, 64, {}
        # as many key/value heads as query heads: the values stay a view of the projection
        lit_mha = lambda: litgpt_model(4, 64, groups=4)  # noqa: E731
        yield "litgpt-mha-tiny-adamw", lit_mha, "adamw", 4, 64, {}
    else:
        print("litgpt is not installed: litgpt-* not recorded", file=sys.stderr)
    # mixtures of experts: transformers' own Mixtral (4 experts, top-2, each a gated
    # feed-forward) and Qwen2-MoE (8 experts of 128, top-2, beside a gated shared expert of
    # 256), their experts run by transformers' default experts implementation (`grouped_mm`)
    tiny_moe = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=1024, max_position_embeddings=128,
                    tie_word_embeddings=False, num_experts_per_tok=2)
    tiny_mixtral = dict(tiny_moe, intermediate_size=256, num_local_experts=4)
    tiny_qwen2_moe = dict(tiny_moe, intermediate_size=344, moe_intermediate_size=128,
                          shared_expert_intermediate_size=256, num_experts=8)
    mixtral = lambda: hf_model("mixtral", tiny_mixtral, 4, 64)  # noqa: E731
    qwen2_moe = lambda: hf_model("qwen2_moe", tiny_qwen2_moe, 4, 64)  # noqa: E731
    for opt in ["sgd", "adamw"]:
        yield f"mixtral-tiny-{opt}", mixtral, opt, 4, 64, {}
        yield f"qwen2-moe-tiny-{opt}", qwen2_moe, opt, 4, 64, {}
    # LoRA on the attention of a mixture of experts (the router and experts frozen)
    moe_qv = {"rank": 8, "alpha": 16, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}
    yield "lora-mixtral-tiny-adamw", with_lora(mixtral, moe_qv), "adamw", 4, 64, {}
    yield "lora-qwen2-moe-tiny-adamw", with_lora(qwen2_moe, moe_qv), "adamw", 4, 64, {}
    # torch.autocast to fp16 on the CPU
    f16 = {"autocast": "float16"}
    yield "autocast-f16-mlp-adamw", (lambda: mlp(32)), "adamw", 32, 0, f16
    yield "autocast-f16-gpt2-tiny-adamw", gpt2, "adamw", 4, 64, f16
    yield "autocast-f16-llama-tiny-adamw", llama, "adamw", 4, 64, f16


def cuda_runs():
    """The GPU suite (`--suite cuda`): the suite's model families at a size where activations
    dominate (sequence 1024, batch 4): `transformers`' LLaMA with eager attention and with
    `sdpa` (the fused kernels; under bf16 PyTorch picks its flash-attention kernel for causal
    attention without a mask), f32 with foreach and fused AdamW, `torch.autocast` to bf16, the
    model cast to bf16, LoRA; GPT-2 with dropout (CUDA's one-byte masks); the hand-written GPT
    eager and with `scaled_dot_product_attention`; litgpt's model, full and LoRA. Each run
    takes seconds on a GPU."""
    seq = 1024
    llama = dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8,
                 num_key_value_heads=4, intermediate_size=1376, vocab_size=8192,
                 max_position_embeddings=seq, tie_word_embeddings=False)
    gpt2 = dict(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=seq)
    bf16 = {"autocast": "bfloat16"}

    def hf(kind, config, attention):
        return lambda: hf_model(kind, config, 4, seq, attention)

    yield "llama-small-eager-adamw", hf("llama", llama, "eager"), "adamw", 4, seq, {}
    yield "llama-small-sdpa-adamw", hf("llama", llama, "sdpa"), "adamw", 4, seq, {}
    yield "llama-small-sdpa-adamw-fused", hf("llama", llama, "sdpa"), "adamw-fused", 4, seq, {}
    yield "autocast-llama-small-sdpa-adamw-fused", hf("llama", llama, "sdpa"), "adamw-fused", \
        4, seq, bf16
    yield "autocast-llama-small-eager-adamw", hf("llama", llama, "eager"), "adamw", 4, seq, bf16
    yield "bf16-llama-small-sdpa-adamw", hf("llama", llama, "sdpa"), "adamw", 4, seq, \
        {"dtype": "bfloat16"}
    lora = with_lora(hf("llama", llama, "sdpa"), {"rank": 8, "alpha": 16, "dropout": 0.0,
                                                  "targets": ["q_proj", "v_proj"]})
    yield "lora-autocast-llama-small-sdpa-adamw", lora, "adamw", 4, seq, bf16
    yield "gpt2-small-eager-adamw", hf("gpt2", gpt2, "eager"), "adamw", 4, seq, {}
    yield "autocast-gpt2-small-sdpa-adamw-fused", hf("gpt2", gpt2, "sdpa"), "adamw-fused", \
        4, seq, bf16
    hw = dict(vocab=8192, layers=4, width=512, heads=8)
    yield "handwritten-gpt-small-adamw", (lambda: handwritten_gpt(4, seq, False, **hw)), \
        "adamw", 4, seq, {}
    yield "autocast-handwritten-gpt-small-sdpa-adamw-fused", \
        (lambda: handwritten_gpt(4, seq, True, **hw)), "adamw-fused", 4, seq, bf16
    if have_litgpt():
        lit = dict(vocab=8192, layers=4, width=512, heads=8, groups=4, inner=1376)
        yield "litgpt-llama-small-adamw-fused", (lambda: litgpt_model(4, seq, **lit)), \
            "adamw-fused", 4, seq, {}
        yield "lora-litgpt-llama-small-adamw", \
            (lambda: litgpt_model(4, seq, lora=True, **lit)), "adamw", 4, seq, {}


def family_runs():
    """The model families at their published sizes (`--suite families`, for `--device
    fake-cuda`: fake tensors need no memory, so a 7B model's forward is recorded on any
    machine): each configuration in `fixtures/hf/` as `transformers` builds it, batch 1,
    sequence 2048 (or the model's positions, if fewer): under autocast to bf16 with the
    attention `transformers` picks (SDPA where the family has it: flash attention on a GPU),
    cast to bf16 with the same attention, and in f32 with eager attention; LLaMA-2-7B with
    LoRA on `q_proj` and `v_proj` too, five families under activation checkpointing, and
    three at long context (Mistral and Phi-3 at their full positions, where their sliding
    windows mask; LLaMA-2-7B at batch 4)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "hf")
    bf16 = {"autocast": "bfloat16"}
    for file in sorted(os.listdir(root)):
        if not file.endswith(".json"):
            continue
        with open(os.path.join(root, file)) as f:
            config = json.load(f)
        kind = config.pop("model_type")
        if kind in ("bert", "gemma3"):
            continue  # an encoder classifier; the multimodal Gemma 3 wrapper
        for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype",
                    "dtype", "auto_map"):
            config.pop(key, None)
        positions = config.get("max_position_embeddings") or config.get("n_positions") or 2048
        seq = min(2048, positions)
        name = file[:-len(".json")]
        build = (lambda kind=kind, config=config, seq=seq: hf_model(kind, config, 1, seq))
        yield f"autocast-{name}-seq{seq}", build, "adamw-fused", 1, seq, bf16
        # the model cast to bf16 (no autocast), and f32 with eager attention
        yield f"bf16-{name}-seq{seq}", build, "adamw", 1, seq, {"dtype": "bfloat16"}
        eager = (lambda kind=kind, config=config, seq=seq:
                 hf_model(kind, config, 1, seq, "eager"))
        yield f"{name}-eager-seq{seq}", eager, "adamw", 1, seq, {}
        if name == "llama-2-7b":
            lora = with_lora(build, {"rank": 8, "alpha": 16, "dropout": 0.0,
                                     "targets": ["q_proj", "v_proj"]})
            yield f"lora-autocast-{name}-seq{seq}", lora, "adamw", 1, seq, bf16
        if name in ("mistral-7b", "phi-3-mini-4k", "llama-2-7b"):
            # long context: Mistral's and Phi-3's windows then mask; LLaMA at batch 4
            long = min(8192, positions)
            n = 4 if name == "llama-2-7b" else 1
            build_long = (lambda kind=kind, config=config, long=long, n=n:
                          hf_model(kind, config, n, long))
            yield f"autocast-{name}-batch{n}-seq{long}", build_long, "adamw-fused", n, long, bf16
        if name in ("llama-2-7b", "gpt2", "phi-2", "gemma-2b", "falcon-7b"):
            # activation checkpointing: forward keeps each block's input
            yield f"autocast-{name}-seq{seq}-checkpointing", build, "adamw", 1, seq, \
                dict(bf16, checkpointing=True)


def probe_blas_workspaces():
    """The device memory cuBLAS takes through the caching allocator, measured in a process
    that has not used CUDA yet: `memory_allocated` before and after each step minus the
    bytes of the tensors the step made (rounded to the allocator's 512-byte blocks). The
    steps: a matmul on this thread (its cuBLAS handle's workspace), a linear layer with a
    bias on a 2-D input (`addmm` through cuBLASLt: its workspace), the backward of a matmul
    (the autograd engine's device thread: a handle and workspace of its own), the same
    again (nothing new), and `empty_cache` (the workspaces stay)."""
    cuda = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)

    def block(t):
        return -(-t.untyped_storage().nbytes() // 512) * 512

    steps = []

    def step(name, made, before):
        torch.cuda.synchronize()
        now = torch.cuda.memory_allocated()
        steps.append({"step": name, "allocated": now,
                      "untracked": now - before - sum(block(t) for t in made)})
        return now

    a = torch.randn(256, 256, device=cuda)
    b = torch.randn(256, 256, device=cuda)
    bias = torch.randn(256, device=cuda)
    torch.cuda.synchronize()
    now = torch.cuda.memory_allocated()
    c = a @ b
    now = step("matmul (this thread)", [c], now)
    d = torch.nn.functional.linear(a, b, bias)
    now = step("linear with a bias (addmm)", [d], now)
    w = b.clone().requires_grad_(True)
    now = step("clone", [w], now)
    (a @ w).sum().backward()
    now = step("backward of a matmul (autograd's thread)", [w.grad], now)
    w.grad = None
    torch.cuda.synchronize()
    now = torch.cuda.memory_allocated()
    (a @ w).sum().backward()
    now = step("the same backward again", [w.grad], now)
    del c, d
    torch.cuda.empty_cache()
    step("empty_cache", [], torch.cuda.memory_allocated())
    return {
        "device": {"type": "cuda", "name": props.name, "total_memory": props.total_memory,
                   "capability": [props.major, props.minor]},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "env": {k: os.environ.get(k) for k in
                ["CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                 "TORCH_CUBLASLT_UNIFIED_WORKSPACE"]},
        "steps": steps,
    }


def device_slug(device):
    """The folder a device's recordings go in: its name, lower case, words joined by `-`."""
    if device == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name(0).lower()
    return "-".join("".join(c if c.isalnum() else " " for c in name).split())


def record_each_in_its_own_process(args, names):
    """Runs this script once per run of the suite (`--exact NAME`), each in a fresh process;
    stops at the first that fails."""
    for name in names:
        if args.only and args.only not in name:
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--out", args.out,
               "--device", args.device, "--suite", args.suite, "--steps", str(args.steps),
               "--threads", str(args.threads), "--exact", name]
        if args.snapshots:
            cmd.append("--snapshots")
        if args.explain:
            cmd += ["--explain", args.explain]
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0:
            sys.exit(f"{name}: its recording process failed (exit {done.returncode})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True,
                        help="the folder to write to (with --device cuda: a folder named "
                             "after the GPU inside it)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "fake-cuda"],
                        help="fake-cuda: the GPU's dispatch on PyTorch's fake tensors, on any "
                             "machine (the ledger's storages; no allocator figures)")
    parser.add_argument("--suite", default="cpu", choices=["cpu", "cuda", "families"],
                        help="the CPU suite (small models), the GPU suite (sequence 1024), or "
                             "the model families at their published sizes (for fake-cuda)")
    parser.add_argument("--snapshots", action="store_true",
                        help="with --device cuda: dump each run's allocator snapshot beside "
                             "its ledger (NAME.pickle)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", default=None, help="record only runs whose name contains this")
    parser.add_argument("--fresh-process", action="store_true",
                        help="record each run in a process of its own, as a training script "
                             "runs: it pays for its own CUDA context and cuBLAS workspaces "
                             "instead of finding an earlier run's in the caching allocator")
    parser.add_argument("--exact", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (the storages recorded do not depend on it)")
    parser.add_argument("--explain", default=None,
                        help="print the storages live at the highest total of this run")
    parser.add_argument("--probe-blas", action="store_true",
                        help="with --device cuda, in a process that has not used CUDA: "
                             "measure cuBLAS's workspaces (probes/blas-workspaces.json) and stop")
    args = parser.parse_args()
    out = args.out
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda: no GPU is visible to torch")
        out = os.path.join(out, device_slug("cuda"))
    os.makedirs(out, exist_ok=True)
    if args.probe_blas:
        if args.device != "cuda":
            sys.exit("--probe-blas measures a GPU: give --device cuda")
        # in a folder of its own: `cargo xtask validate` reads the ledgers beside it
        os.makedirs(os.path.join(out, "probes"), exist_ok=True)
        path = os.path.join(out, "probes", "blas-workspaces.json")
        with open(path, "w") as f:
            json.dump(probe_blas_workspaces(), f, indent=1)
            f.write("\n")
        print(f"cuBLAS workspaces -> {path}", file=sys.stderr)
        return
    torch.set_num_threads(args.threads)
    suite = {"cpu": runs, "cuda": cuda_runs, "families": family_runs}[args.suite]()
    if args.fresh_process:
        record_each_in_its_own_process(args, [entry[0] for entry in suite])
        return
    for name, build, opt, batch, seq, extra in suite:
        if args.only and args.only not in name:
            continue
        if args.exact and name != args.exact:
            continue
        snapshot = None
        if args.device == "cuda" and args.snapshots:
            snapshot = os.path.join(out, f"{name}.pickle")
        rec = record(name, build, opt, batch, seq, args.steps, **extra,
                     explain=(name == args.explain), device=args.device, snapshot=snapshot)
        path = os.path.join(out, f"{name}.json")
        with open(path, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        peak = max(s["peak_since_previous"] for s in rec["samples"])
        line = f"{name}: {rec['parameters']} parameters, peak {peak} B"
        if args.device == "cuda":
            line += ", max_memory_allocated {} B, max_memory_reserved {} B".format(
                max(s["cuda"]["peak_allocated"] for s in rec["samples"]),
                max(s["cuda"]["peak_reserved"] for s in rec["samples"]))
        print(f"{line} -> {path}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
