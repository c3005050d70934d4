//! What a recorded stack says: the phase of training it ran in (module calls, the autograd
//! engine, an optimizer, `zero_grad`, moving a batch or a model to the device) and the source
//! line to report it under.

use serde::Serialize;
use trainmem_alloc::Frame;

/// The phase a stack shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StackPhase {
    /// Building or loading the model: a module's `__init__`, `Module._apply` (`.to()`,
    /// `.cuda()`), `load_state_dict`, `torch.nn.init`, copying a model.
    Setup,
    /// Moving a batch to the device (`Tensor.to`/`.cuda` outside a module, a data loader).
    Data,
    /// A module's forward (`forward`, `Module._call_impl`).
    Forward,
    /// The autograd engine (`torch::autograd::Engine`) or `Tensor.backward`.
    Backward,
    /// An optimizer's step (`torch/optim`, or a file named like an optimizer).
    Optimizer,
    /// `zero_grad`.
    ZeroGrad,
}

impl StackPhase {
    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            StackPhase::Setup => "model setup",
            StackPhase::Data => "data",
            StackPhase::Forward => "forward",
            StackPhase::Backward => "backward",
            StackPhase::Optimizer => "optimizer step",
            StackPhase::ZeroGrad => "zero_grad",
        }
    }
}

/// A Python source frame (a `.py` file, or code Python compiled from a string such as
/// `<eval_with_key>`), not a C++ or interpreter frame.
pub fn is_python(f: &Frame) -> bool {
    f.filename.ends_with(".py") || (f.filename.starts_with('<') && f.filename.ends_with('>'))
}

fn path(f: &Frame) -> String {
    f.filename.replace('\\', "/")
}

fn file_stem(p: &str) -> &str {
    let name = p.rsplit('/').next().unwrap_or(p);
    name.strip_suffix(".py").unwrap_or(name)
}

/// Code of a library, not the user's own: PyTorch, site-packages, the standard library.
pub fn is_library(f: &Frame) -> bool {
    let p = path(f);
    p.contains("site-packages/")
        || p.contains("dist-packages/")
        || p.contains("/lib/python")
        || p.contains("/torch/")
        || p.starts_with('<')
}

const SETUP_NAMES: [&str; 6] = [
    "_apply",
    "load_state_dict",
    "_load_from_state_dict",
    "reset_parameters",
    "__deepcopy__",
    "__init__",
];

/// The phase `frames` (innermost first) show, if any.
pub fn phase_of<'a>(frames: impl Iterator<Item = &'a Frame> + Clone) -> Option<StackPhase> {
    if frames
        .clone()
        .any(|f| f.name.contains("torch::autograd::Engine::"))
    {
        return Some(StackPhase::Backward);
    }
    let python = frames.clone().filter(|f| is_python(f));
    let mut found: Option<StackPhase> = None;
    let rank = |p: StackPhase| match p {
        StackPhase::ZeroGrad => 0,
        StackPhase::Optimizer => 1,
        StackPhase::Backward => 2,
        StackPhase::Setup => 3,
        StackPhase::Forward => 4,
        StackPhase::Data => 5,
    };
    for f in python {
        let p = path(f);
        let stem = file_stem(&p);
        let this = if f.name == "zero_grad" {
            Some(StackPhase::ZeroGrad)
        } else if p.contains("/optim/") || stem.starts_with("optim") {
            Some(StackPhase::Optimizer)
        } else if f.name == "backward"
            && (p.ends_with("torch/_tensor.py") || p.contains("torch/autograd/"))
        {
            Some(StackPhase::Backward)
        } else if SETUP_NAMES.contains(&f.name.as_str())
            || p.ends_with("torch/nn/init.py")
            || p.ends_with("torch/nn/parameter.py")
        {
            Some(StackPhase::Setup)
        } else if f.name == "forward" || f.name == "_call_impl" || f.name == "_wrapped_call_impl" {
            Some(StackPhase::Forward)
        } else if p.contains("torch/utils/data/") {
            Some(StackPhase::Data)
        } else {
            None
        };
        if let Some(t) = this
            && found.is_none_or(|old| rank(t) < rank(old))
        {
            found = Some(t);
        }
    }
    if found.is_none()
        && frames.clone().any(|f| {
            f.name.starts_with("torch::autograd::THPVariable_to(")
                || f.name.starts_with("torch::autograd::THPVariable_cuda(")
                || f.name.contains("pin_memory")
        })
    {
        return Some(StackPhase::Data);
    }
    found
}

/// A library's scratch buffer rather than a tensor: cuBLAS's workspace for a handle
/// (`at::cuda::getNewWorkspace`, `getCUDABlasLtWorkspace`), made by the first matrix product
/// on a stream and thread (the autograd engine's thread gets its own in backward) and kept for
/// the handle's life. It is never model state, whatever its size or the phase around it.
pub fn is_workspace<'a>(mut frames: impl Iterator<Item = &'a Frame>) -> bool {
    frames.any(|f| f.name.contains("getNewWorkspace") || f.name.contains("BlasLtWorkspace"))
}

/// A module's own machinery made the block: a frame of `torch.nn`'s modules, parameters or
/// initialisers, a state dict loaded, or transformers' model loading.
pub fn is_module_machinery<'a>(mut frames: impl Iterator<Item = &'a Frame>) -> bool {
    frames.any(|f| {
        if !is_python(f) {
            return false;
        }
        let p = path(f);
        p.contains("torch/nn/modules/")
            || p.ends_with("torch/nn/parameter.py")
            || p.ends_with("torch/nn/init.py")
            || p.ends_with("transformers/modeling_utils.py")
            || f.name == "load_state_dict"
            || f.name == "_load_from_state_dict"
    })
}

/// The source line an allocation is reported under: the innermost frame of the user's own
/// code, else the innermost Python frame.
pub fn site_of<'a>(frames: impl Iterator<Item = &'a Frame> + Clone) -> Option<&'a Frame> {
    frames
        .clone()
        .find(|f| is_python(f) && !is_library(f))
        .or_else(|| frames.clone().find(|f| is_python(f)))
}

/// The line of the model's code that made an allocation: the innermost Python frame outside
/// PyTorch's own package and the standard library. A transformers, peft or user module's line
/// counts even from site-packages (a layer's norm or MLP line, run once per block); `torch.nn`'s
/// layers do not (the same `Linear.forward` line runs for every layer of every kind), nor does
/// a notebook cell that calls the model (run once for the whole forward) when a deeper frame
/// exists.
pub fn model_line<'a>(mut frames: impl Iterator<Item = &'a Frame>) -> Option<&'a Frame> {
    frames.find(|f| {
        if !is_python(f) {
            return false;
        }
        let p = path(f);
        let stdlib = p.contains("/lib/python") && !p.contains("-packages/");
        !p.contains("/torch/") && !stdlib
    })
}

/// For a stack with no Python frame: the autograd node that allocated
/// (`MmBackward0`, `AccumulateGrad`), if the stack shows one.
pub fn autograd_node<'a>(mut frames: impl Iterator<Item = &'a Frame>) -> Option<String> {
    frames.find_map(|f| {
        let n = &f.name;
        let at = n.find("::generated::").map(|i| i + "::generated::".len())?;
        let rest = &n[at..];
        let end = rest.find("::").unwrap_or(rest.len());
        Some(rest[..end].to_string())
    })
}

/// `file:line function`, with the file's last two path components.
pub fn site_name(f: &Frame) -> String {
    let p = path(f);
    let mut parts: Vec<&str> = p.rsplit('/').take(2).collect();
    parts.reverse();
    format!("{}:{} {}", parts.join("/"), f.line, f.name)
}

/// The name an allocation is reported under: its site, else its autograd node, else what is
/// known of it.
pub fn site_label<'a>(
    frames: impl Iterator<Item = &'a Frame> + Clone,
    before_recording: bool,
    category: &str,
) -> String {
    match site_of(frames.clone()) {
        Some(f) => site_name(f),
        None => match autograd_node(frames.clone()) {
            Some(node) => format!("autograd {node} (no Python frame)"),
            None if before_recording => format!("(live before recording began: {category})"),
            None if frames.clone().next().is_some() => "(C++ frames only)".to_string(),
            None => "(no stack recorded)".to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fr(file: &str, line: i64, name: &str) -> Frame {
        Frame {
            filename: file.into(),
            line,
            name: name.into(),
        }
    }

    #[test]
    fn phases_from_real_shapes_of_stacks() {
        let module = fr(
            "/x/site-packages/torch/nn/modules/module.py",
            1750,
            "_call_impl",
        );
        let user_fwd = fr("/home/u/model.py", 39, "forward");
        let engine = fr(
            "??",
            0,
            "torch::autograd::Engine::thread_main(std::shared_ptr)",
        );
        let optim = fr(
            "/x/site-packages/torch/optim/adam.py",
            579,
            "_multi_tensor_adam",
        );
        let own_optim = fr("/home/u/optimizers.py", 82, "step");
        let train = fr("/home/u/train.py", 10, "<module>");
        let to = fr(
            "python_variable_methods.cpp",
            0,
            "torch::autograd::THPVariable_to(_object*)",
        );
        let apply = fr(
            "/x/site-packages/torch/nn/modules/module.py",
            1158,
            "convert",
        );
        let apply2 = fr("/x/site-packages/torch/nn/modules/module.py", 833, "_apply");
        let zg = fr(
            "/x/site-packages/torch/optim/optimizer.py",
            900,
            "zero_grad",
        );
        let ph = |v: Vec<&Frame>| phase_of(v.into_iter());
        assert_eq!(
            ph(vec![&user_fwd, &module, &train]),
            Some(StackPhase::Forward)
        );
        assert_eq!(
            ph(vec![&user_fwd, &module, &engine]),
            Some(StackPhase::Backward)
        );
        assert_eq!(ph(vec![&optim, &train]), Some(StackPhase::Optimizer));
        assert_eq!(ph(vec![&own_optim, &train]), Some(StackPhase::Optimizer));
        assert_eq!(ph(vec![&to, &train]), Some(StackPhase::Data));
        assert_eq!(ph(vec![&to, &user_fwd, &train]), Some(StackPhase::Forward));
        assert_eq!(ph(vec![&apply, &apply2, &train]), Some(StackPhase::Setup));
        assert_eq!(ph(vec![&zg, &train]), Some(StackPhase::ZeroGrad));
        assert_eq!(ph(vec![&train]), None);
        assert_eq!(ph(vec![]), None);
        let site = site_of([&optim, &own_optim, &train].into_iter()).unwrap();
        assert_eq!(site_name(site), "u/optimizers.py:82 step");
        let lib_only = site_of([&engine, &optim].into_iter()).unwrap();
        assert_eq!(lib_only.name, "_multi_tensor_adam");
        assert!(site_of([&engine].into_iter()).is_none());
        let node = fr(
            "??",
            0,
            "torch::autograd::generated::MmBackward0::apply(std::vector)",
        );
        assert_eq!(
            autograd_node([&engine, &node].into_iter()).as_deref(),
            Some("MmBackward0")
        );
        assert!(site_of(std::iter::empty()).is_none());
    }
}
