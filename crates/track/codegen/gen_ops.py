#!/usr/bin/env python3
"""Writes crates/track/src/ops.rs: the op-trait implementations of `Tracked<B>`.

Every method of burn-backend's op traits (required and defaulted) is implemented by calling the
inner backend's method of the same name: inputs are unwrapped from their `TrackedTensor`s (their
buffer tokens kept alive until the outputs are wrapped), outputs are wrapped, which counts the
buffer each output holds. Run it again when the burn pin moves:

    python3 crates/track/codegen/gen_ops.py ~/.cargo/registry/src/*/burn-backend-<version>/src

A method that a later burn adds without a default makes `Tracked<B>` fail to compile until this
is run again; one added with a default runs burn's default body over tracked ops, so its
buffers are still counted.
"""
import re
import sys
from pathlib import Path

TRAITS = [
    ("backend/ops/tensor.rs", "FloatTensorOps"),
    ("backend/ops/int_tensor.rs", "IntTensorOps"),
    ("backend/ops/bool_tensor.rs", "BoolTensorOps"),
    ("backend/ops/qtensor.rs", "QTensorOps"),
    ("backend/ops/activation.rs", "ActivationOps"),
    ("backend/ops/modules/base.rs", "ModuleOps"),
    ("backend/ops/transaction.rs", "TransactionOps"),
]

# Ops whose output is a view of their first tensor input: with a backend that cannot name its
# buffers, the output shares that input's token instead of counting new bytes.
VIEW_SUFFIXES = (
    "_reshape", "_swap_dims", "_permute", "_flip", "_expand", "_slice", "_detach",
    "_set_require_grad", "_unfold",
)

KINDS = {"FloatTensor": "float", "IntTensor": "int", "BoolTensor": "bool", "QuantizedTensor": "q"}


def strip_comments(src):
    return re.sub(r"//[^\n]*", "", src)


def split_top(s, sep=","):
    out, depth, cur = [], 0, ""
    for c in s:
        if c in "<([":
            depth += 1
        elif c in ">)]":
            depth -= 1
        if c == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    if cur.strip():
        out.append(cur)
    return [x.strip() for x in out if x.strip()]


def methods(src, trait):
    src = strip_comments(src)
    start = src.index(f"pub trait {trait}<B: Backend>")
    body_start = src.index("{", start) + 1
    depth, i = 1, body_start
    while depth:
        if src[i] == "{":
            depth += 1
        elif src[i] == "}":
            depth -= 1
        i += 1
    body = src[body_start:i - 1]
    pos = 0
    while True:
        m = re.search(r"\bfn\s+(\w+)\s*(<[^(]*?>)?\s*\(", body[pos:])
        if not m:
            return
        name, generics = m.group(1), m.group(2) or ""
        j = pos + m.end()
        depth, k = 1, j
        while depth:
            if body[k] == "(":
                depth += 1
            elif body[k] == ")":
                depth -= 1
            k += 1
        params = body[j:k - 1]
        e = k
        while body[e] not in "{;":
            e += 1
        ret = body[k:e].strip()
        where = ""
        if " where " in " " + ret or ret.startswith("where") or "\nwhere" in ret:
            idx = ret.find("where")
            ret, where = ret[:idx].strip(), ret[idx:].strip()
        # skip the default body
        if body[e] == "{":
            depth, e = 1, e + 1
            while depth:
                if body[e] == "{":
                    depth += 1
                elif body[e] == "}":
                    depth -= 1
                e += 1
        pos = e
        yield name, generics, split_top(params), ret, where


def outer(ty):
    """The parameter type as written in the impl for `Tracked<B>` (Self is the outer backend)."""
    # Paths written inside burn-backend name burn's public re-exports here.
    ty = ty.replace("crate::tensor::", "burn::tensor::")
    return re.sub(r"\bB\b", "Self", ty)


def tensor_kind(ty):
    m = re.fullmatch(r"(\w+)<B>", ty)
    return KINDS.get(m.group(1)) if m else None


def unwrap_param(name, ty, keeps):
    """Statements turning parameter `name` into the inner backend's value; returns the expression."""
    k = tensor_kind(ty)
    if k:
        keeps.append(f"k_{name}")
        return f"let ({name}, k_{name}) = crate::tensor::unwrap_{k}::<B>({name});", name
    if ty.startswith("&") and tensor_kind(ty[1:]):
        return "", f"&{name}.inner"
    m = re.fullmatch(r"Option<(\w+<B>)>", ty)
    if m and tensor_kind(m.group(1)):
        keeps.append(f"k_{name}")
        k2 = tensor_kind(m.group(1))
        return (f"let ({name}, k_{name}) = {name}.map(crate::tensor::unwrap_{k2}::<B>).unzip();", name)
    m = re.fullmatch(r"Vec<(\w+<B>)>", ty)
    if m and tensor_kind(m.group(1)):
        keeps.append(f"k_{name}")
        k2 = tensor_kind(m.group(1))
        return (f"let ({name}, k_{name}): (Vec<_>, Vec<_>) = {name}.into_iter().map(crate::tensor::unwrap_{k2}::<B>).unzip();", name)
    if ty == "TensorPrimitive<B>":
        keeps.append(f"k_{name}")
        return f"let ({name}, k_{name}) = crate::tensor::unwrap_primitive::<B>({name});", name
    if ty == "QuantizationParametersPrimitive<B>":
        keeps.append(f"k_{name}")
        return (f"let ({name}, k_{name}) = crate::tensor::unwrap_qparams::<B>({name});", name)
    if ty == "TransactionPrimitive<B>":
        keeps.append(f"k_{name}")
        return (f"let ({name}, k_{name}) = crate::tensor::unwrap_transaction::<B>({name});", name)
    if "<B>" in ty.replace("Device<B>", ""):
        raise SystemExit(f"unhandled parameter type {ty!r} of {name}")
    return "", name


def wrap(expr, ty, hint):
    k = tensor_kind(ty)
    if k:
        return f"crate::tensor::wrap_{k}::<B>({expr}, {hint})"
    tup = re.fullmatch(r"\((.*)\)", ty)
    if tup:
        parts = split_top(tup.group(1))
        names = [f"o{i}" for i in range(len(parts))]
        inner = ", ".join(wrap(n, p, "None") for n, p in zip(names, parts))
        return f"{{ let ({', '.join(names)}) = {expr}; ({inner}) }}"
    if ty == "TensorPrimitive<B>":
        return f"crate::tensor::wrap_primitive::<B>({expr})"
    # data read back to the host: buffers outside Rust's allocator are counted while held
    if ty == "Result<TensorData, ExecutionError>":
        return f"{expr}.map(crate::host_reads::watch)"
    if ty == "Result<TransactionPrimitiveData, ExecutionError>":
        return f"{expr}.map(crate::host_reads::watch_transaction)"
    if ty in ("MaxPool1dWithIndices<B>", "MaxPool2dWithIndices<B>"):
        s = ty.split("<")[0]
        return (f"{{ let o = {expr}; {s}::new(crate::tensor::wrap_float::<B>(o.output, None), "
                f"crate::tensor::wrap_int::<B>(o.indices, None)) }}")
    if ty in ("MaxPool1dBackward<B>", "MaxPool2dBackward<B>"):
        s = ty.split("<")[0]
        return f"{{ let o = {expr}; {s}::new(crate::tensor::wrap_float::<B>(o.x_grad, None)) }}"
    if ty == "DeformConv2dBackward<B>":
        return (f"{{ let o = {expr}; DeformConv2dBackward::new("
                "crate::tensor::wrap_float::<B>(o.x_grad, None), "
                "crate::tensor::wrap_float::<B>(o.offset_grad, None), "
                "crate::tensor::wrap_float::<B>(o.weight_grad, None), "
                "o.mask_grad.map(|t| crate::tensor::wrap_float::<B>(t, None)), "
                "o.bias_grad.map(|t| crate::tensor::wrap_float::<B>(t, None))) }")
    if "<B>" in ty.replace("Device<B>", ""):
        raise SystemExit(f"unhandled return type {ty!r}")
    return expr


def method(trait, name, generics, params, ret, where):
    keeps, stmts, args, sig = [], [], [], []
    for p in params:
        pname, pty = [x.strip() for x in p.split(":", 1)]
        pname = pname.replace("mut ", "").lstrip("_")
        sig.append(f"{pname}: {outer(pty)}")
        stmt, arg = unwrap_param(pname, pty, keeps)
        if stmt:
            stmts.append(stmt)
        args.append(arg)
    rty = ret[2:].strip() if ret.startswith("->") else ""
    call = f"B::{name}({', '.join(args)})"
    first_keep = keeps[0] if keeps else None
    hint = "None"
    if name.endswith(VIEW_SUFFIXES) and first_keep and not name.endswith("slice_assign"):
        hint = f"{first_keep}.as_ref()"
    fut = re.fullmatch(r"impl Future<Output = (.*)>(.*)", rty)
    lines = [f"    fn {name}{generics}({', '.join(sig)}){(' -> ' + outer(rty)) if rty else ''} {outer(where)} {{"]
    if name.endswith("_from_data"):
        lines.append("        let _op = crate::tensor::OpScope::from_data(&data);")
    else:
        lines.append("        let _op = crate::tensor::OpScope::enter();")
    lines += [f"        {s}" for s in stmts]
    if fut:
        out_ty = fut.group(1)
        keep_tuple = ", ".join(keeps)
        lines.append(f"        let fut = {call};")
        lines.append("        async move {")
        lines.append(f"            let out = {wrap('fut.await', out_ty, 'None')};")
        if keeps:
            lines.append(f"            drop(({keep_tuple},));")
        lines.append("            out")
        lines.append("        }")
    else:
        if keeps and rty:
            lines.append(f"        let out = {wrap(call, rty, hint) if rty else call};")
            lines.append(f"        drop(({', '.join(keeps)},));")
            lines.append("        out")
        elif rty:
            lines.append(f"        {wrap(call, rty, hint)}")
        else:
            lines.append(f"        {call};")
            if keeps:
                lines.append(f"        drop(({', '.join(keeps)},));")
    lines.append("    }")
    return "\n".join(lines)


def main():
    root = Path(sys.argv[1])
    out = [
        "// @generated by crates/track/codegen/gen_ops.py from burn-backend's op traits; do not edit.",
        "//! The op traits of `Tracked<B>`: every method calls the inner backend's method of the same",
        "//! name, unwrapping inputs and wrapping outputs (which counts their buffers).",
        "#![allow(clippy::all, unused_variables, unused_imports, unused_mut)]",
        "",
        "use core::future::Future;",
        "use core::ops::Range;",
        "use burn::tensor::backend::ExecutionError;",
        "use burn::tensor::ops::*;",
        "use burn::tensor::quantization::{QuantScheme, QuantizationParametersPrimitive};",
        "use burn::tensor::{Distribution, Scalar, Shape, Slice, TensorData, TensorPrimitive};",
        "use burn::tensor::{BoolDType, FloatDType, IntDType};",
        "use burn::tensor::backend::Backend;",
        "type Device<B> = <B as burn::tensor::backend::BackendTypes>::Device;",
        "",
        "use crate::buffer::TrackableBackend;",
        "use crate::backend::Tracked;",
        "",
    ]
    count = 0
    for path, trait in TRAITS:
        src = (root / path).read_text()
        out.append(f"impl<B: TrackableBackend> {trait}<Self> for Tracked<B> {{")
        for name, generics, params, ret, where in methods(src, trait):
            out.append(method(trait, name, generics, params, ret, where))
            count += 1
        out.append("}")
        out.append("")
    Path(__file__).resolve().parent.parent.joinpath("src/ops.rs").write_text("\n".join(out))
    print(f"{count} methods", file=sys.stderr)


if __name__ == "__main__":
    main()
