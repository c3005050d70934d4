//! LoRA in peft's words: the module names a `LoraConfig`'s `target_modules` lists for each
//! family, `all-linear`, and the `adapter_config.json` peft saves.
//!
//! peft matches a `target_modules` entry against the end of each module's dotted name, so
//! `c_proj` adapts both of GPT-2's (`attn.c_proj` and `mlp.c_proj`) and `self_attn.q_proj`
//! adapts `q_proj`. `all-linear` adapts every linear layer but the output head.

use serde_json::{Map, Value};

use super::HfConfigError;
use crate::model::{LoraSpec, LoraTarget, TransformerSpec};

use LoraTarget::*;

/// The projections of a block of `model_type` by their module names (dotted suffixes), as
/// `transformers` names them; the flag marks a linear layer `all-linear` takes.
fn modules(model_type: &str) -> &'static [(&'static str, &'static [LoraTarget])] {
    match model_type {
        "gpt2" => &[
            ("c_attn", &[Qkv]),
            ("attn.c_proj", &[O]),
            ("c_fc", &[Up]),
            ("mlp.c_proj", &[Down]),
        ],
        "bert" => &[
            ("query", &[Q]),
            ("key", &[K]),
            ("value", &[V]),
            ("attention.output.dense", &[O]),
            ("intermediate.dense", &[Up]),
        ],
        "opt" => &[
            ("q_proj", &[Q]),
            ("k_proj", &[K]),
            ("v_proj", &[V]),
            ("out_proj", &[O]),
            ("fc1", &[Up]),
            ("fc2", &[Down]),
        ],
        "phi" => &[
            ("q_proj", &[Q]),
            ("k_proj", &[K]),
            ("v_proj", &[V]),
            ("dense", &[O]),
            ("fc1", &[Up]),
            ("fc2", &[Down]),
        ],
        "phi3" => &[
            ("qkv_proj", &[Qkv]),
            ("o_proj", &[O]),
            ("gate_up_proj", &[GateUp]),
            ("down_proj", &[Down]),
        ],
        "gpt_neox" | "falcon" | "bloom" => &[
            ("query_key_value", &[Qkv]),
            ("dense", &[O]),
            ("dense_h_to_4h", &[Up]),
            ("dense_4h_to_h", &[Down]),
        ],
        "starcoder2" => &[
            ("q_proj", &[Q]),
            ("k_proj", &[K]),
            ("v_proj", &[V]),
            ("o_proj", &[O]),
            ("c_fc", &[Up]),
            ("c_proj", &[Down]),
        ],
        "gptj" => &[
            ("q_proj", &[Q]),
            ("k_proj", &[K]),
            ("v_proj", &[V]),
            ("out_proj", &[O]),
            ("fc_in", &[Up]),
            ("fc_out", &[Down]),
        ],
        // the attention of a mixture of experts (adapters on its experts are not modelled)
        "mixtral" | "qwen2_moe" => &[
            ("q_proj", &[Q]),
            ("k_proj", &[K]),
            ("v_proj", &[V]),
            ("o_proj", &[O]),
        ],
        _ => &[
            ("q_proj", &[Q]),
            ("k_proj", &[K]),
            ("v_proj", &[V]),
            ("o_proj", &[O]),
            ("gate_proj", &[Gate]),
            ("up_proj", &[Up]),
            ("down_proj", &[Down]),
        ],
    }
}

/// The modules peft adapts when a `LoraConfig` names none (its default per family).
fn default_modules(model_type: &str) -> &'static [&'static str] {
    match model_type {
        "gpt2" => &["c_attn"],
        "bert" => &["query", "value"],
        "phi3" => &["qkv_proj"],
        "gpt_neox" | "falcon" | "bloom" => &["query_key_value"],
        _ => &["q_proj", "v_proj"],
    }
}

/// Whether the `target_modules` entry `name` adapts the module whose dotted suffix is
/// `module`.
fn matches(name: &str, module: &str) -> bool {
    name == module || module.ends_with(&format!(".{name}")) || name.ends_with(&format!(".{module}"))
}

/// The projection a peft `target_modules` name (`q_proj`, `c_attn`, ...) stands for in a
/// block of the family `model_type` (`None` when the name is not one of its projections,
/// or stands for more than one).
pub fn lora_target_of_module(model_type: &str, module: &str) -> Option<LoraTarget> {
    let found: Vec<LoraTarget> = modules(model_type)
        .iter()
        .filter(|(m, _)| matches(module, m))
        .flat_map(|(_, t)| t.iter().copied())
        .collect();
    match found.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The projections `names` adapt in a block of `model_type` (the model `t`): peft module
/// names, `all-linear`, or a plan's own target names (`q`, `v`, `qkv`, ...). A name that
/// matches nothing is an error listing the model's module names.
pub fn lora_targets(
    model_type: &str,
    t: &TransformerSpec,
    names: &[String],
) -> Result<Vec<LoraTarget>, HfConfigError> {
    let table = modules(model_type);
    let mut out: Vec<LoraTarget> = Vec::new();
    let push = |x: LoraTarget, out: &mut Vec<LoraTarget>| {
        if !out.contains(&x) {
            out.push(x);
        }
    };
    for name in names {
        let name = name.trim();
        if name == "all-linear" {
            if model_type == "bert" || t.moe.is_some() {
                return Err(HfConfigError::Peft(format!(
                    "target_modules all-linear on {model_type}: it adapts linear layers \
                     outside the blocks' projections here (the pooler and classifier, or a \
                     mixture of experts' router and experts), which are not modelled; list \
                     the modules ({})",
                    table.iter().map(|(m, _)| *m).collect::<Vec<_>>().join(", ")
                )));
            }
            for (_, targets) in table {
                for &x in *targets {
                    push(x, &mut out);
                }
            }
            continue;
        }
        let hits: Vec<LoraTarget> = table
            .iter()
            .filter(|(m, _)| matches(name, m))
            .flat_map(|(_, t)| t.iter().copied())
            .collect();
        if !hits.is_empty() {
            for x in hits {
                push(x, &mut out);
            }
        } else if let Some(x) = LoraTarget::from_name(name) {
            push(x, &mut out);
        } else {
            let known: Vec<&str> = table.iter().map(|(m, _)| *m).collect();
            let extra = if t.moe.is_some() {
                " (adapters on the experts, their router or a shared expert are not modelled)"
            } else {
                ""
            };
            return Err(HfConfigError::Peft(format!(
                "LoRA target `{name}` matches no module of {model_type}: its projections are \
                 {}, or all-linear{extra}",
                known.join(", ")
            )));
        }
    }
    Ok(out)
}

/// `lora` as the model `t` runs it: a packed query-key-value projection takes the adapters
/// of any of `q`, `k`, `v` as one, as peft does.
pub(super) fn lora_for(t: &TransformerSpec, lora: &LoraSpec) -> LoraSpec {
    let mut out = lora.clone();
    if !t.separate_qkv {
        let mut targets = Vec::new();
        for &x in &lora.targets {
            let x = match x {
                Q | K | V => Qkv,
                other => other,
            };
            if !targets.contains(&x) {
                targets.push(x);
            }
        }
        out.targets = targets;
    }
    out
}

/// What a peft `adapter_config.json` of a LoRA adapter says about memory.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterConfig {
    /// `r`.
    pub rank: u64,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `lora_dropout`.
    pub dropout: f64,
    /// `target_modules` (`None`: peft's default for the family).
    pub target_modules: Option<Vec<String>>,
}

impl AdapterConfig {
    /// The adapters on the model of `model_type` (`t`), their targets read as peft reads
    /// them.
    pub fn lora(&self, model_type: &str, t: &TransformerSpec) -> Result<LoraSpec, HfConfigError> {
        let names: Vec<String> = match &self.target_modules {
            Some(names) => names.clone(),
            None => default_modules(model_type)
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        Ok(LoraSpec {
            rank: self.rank,
            alpha: Some(self.alpha),
            targets: lora_targets(model_type, t, &names)?,
            dropout: self.dropout,
        })
    }
}

/// Reads a peft `adapter_config.json`: a LoRA adapter's rank, alpha, dropout and targets.
/// Another kind of adapter (`peft_type` other than `LORA`) is an error saying which, and so
/// is a LoRA setting that changes memory in a way a plan does not express (DoRA, trained
/// biases, `modules_to_save`, per-layer patterns).
pub fn read_adapter_config(text: &str) -> Result<AdapterConfig, HfConfigError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| adapter_err(format!("does not parse: {e}")))?;
    let Value::Object(map) = value else {
        return Err(adapter_err("the top level is not an object".into()));
    };
    check_lora_type(&map)?;
    let (rank, alpha, dropout) = read_lora_hyperparameters(&map)?;
    reject_unmodelled_settings(&map)?;
    let target_modules = read_target_modules(&map)?;
    Ok(AdapterConfig {
        rank,
        alpha,
        dropout,
        target_modules,
    })
}

/// An error about `adapter_config.json`.
fn adapter_err(m: String) -> HfConfigError {
    HfConfigError::Peft(format!("adapter_config.json: {m}"))
}

/// Checks that `peft_type` names a LoRA adapter.
fn check_lora_type(map: &Map<String, Value>) -> Result<(), HfConfigError> {
    match map.get("peft_type").and_then(Value::as_str) {
        Some("LORA") => Ok(()),
        Some(other) => Err(adapter_err(format!(
            "a {other} adapter (peft_type `{other}`), not LoRA: trainmem plans LoRA adapters"
        ))),
        None => Err(adapter_err(
            "no `peft_type`: not a peft adapter configuration".into(),
        )),
    }
}

/// Reads `r`, `lora_alpha` and `lora_dropout`, with peft's defaults.
fn read_lora_hyperparameters(map: &Map<String, Value>) -> Result<(u64, f64, f64), HfConfigError> {
    let rank = match map.get("r") {
        None => 8,
        Some(v) => match v.as_u64() {
            Some(r) if r > 0 => r,
            _ => {
                return Err(adapter_err(format!(
                    "`r` must be a positive integer, not {v}"
                )));
            }
        },
    };
    let alpha = match map.get("lora_alpha") {
        None => 8.0,
        Some(v) => v
            .as_f64()
            .ok_or_else(|| adapter_err(format!("`lora_alpha` must be a number, not {v}")))?,
    };
    let dropout = match map.get("lora_dropout") {
        None | Some(Value::Null) => 0.0,
        Some(v) => match v.as_f64() {
            Some(p) if (0.0..1.0).contains(&p) => p,
            _ => {
                return Err(adapter_err(format!(
                    "`lora_dropout` must be in [0, 1), not {v}"
                )));
            }
        },
    };
    Ok((rank, alpha, dropout))
}

/// Rejects the LoRA settings whose memory a plan does not express.
fn reject_unmodelled_settings(map: &Map<String, Value>) -> Result<(), HfConfigError> {
    let truthy = |key: &str| map.get(key).is_some_and(|v| v.as_bool() == Some(true));
    let non_empty = |key: &str| match map.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    };
    if truthy("use_dora") {
        return Err(adapter_err(
            "use_dora = true: DoRA's magnitude vectors are not modelled".into(),
        ));
    }
    if truthy("lora_bias") {
        return Err(adapter_err(
            "lora_bias = true: biases on the adapters are not modelled".into(),
        ));
    }
    if let Some(bias) = map.get("bias").and_then(Value::as_str)
        && bias != "none"
    {
        return Err(adapter_err(format!(
            "bias = \"{bias}\": trained biases beside the adapters are not modelled"
        )));
    }
    for key in [
        "modules_to_save",
        "layers_to_transform",
        "rank_pattern",
        "alpha_pattern",
        "target_parameters",
    ] {
        if non_empty(key) {
            return Err(adapter_err(format!(
                "`{key}` is set: not modelled in a plan"
            )));
        }
    }
    Ok(())
}

/// Reads `target_modules`: a list of names, one name, `all-linear`, or absent.
fn read_target_modules(map: &Map<String, Value>) -> Result<Option<Vec<String>>, HfConfigError> {
    Ok(match map.get("target_modules") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            if s != "all-linear" && s.contains(|c: char| "\\^$*+?()[]{}|".contains(c)) {
                return Err(adapter_err(format!(
                    "target_modules is the regular expression `{s}`: list the module names"
                )));
            }
            Some(vec![s.clone()])
        }
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| adapter_err(format!("target_modules holds {v}, not a name")))
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(v) => {
            return Err(adapter_err(format!(
                "target_modules must be a list of names, not {v}"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TransformerKind;

    fn spec(separate_qkv: bool) -> TransformerSpec {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 2, 64, 4, 8, 100);
        t.separate_qkv = separate_qkv;
        t.gated_ffn = true;
        t
    }

    fn names(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn peft_names_are_read_per_family() {
        let t = spec(true);
        let got = lora_targets("llama", &t, &names(&["q_proj", "self_attn.v_proj"])).unwrap();
        assert_eq!(got, vec![Q, V]);
        // GPT-2's `c_proj` is two modules: the attention's output and the feed-forward's
        let got = lora_targets("gpt2", &spec(false), &names(&["c_attn", "c_proj"])).unwrap();
        assert_eq!(got, vec![Qkv, O, Down]);
        let got = lora_targets("gpt_neox", &spec(false), &names(&["query_key_value"])).unwrap();
        assert_eq!(got, vec![Qkv]);
        let all = lora_targets("llama", &t, &names(&["all-linear"])).unwrap();
        assert_eq!(all, vec![Q, K, V, O, Gate, Up, Down]);
        // a plan's own names still read
        assert_eq!(
            lora_targets("llama", &t, &names(&["q", "v"])).unwrap(),
            vec![Q, V]
        );
    }

    #[test]
    fn a_target_matching_no_module_lists_the_model_s_modules() {
        let e = lora_targets("gpt_neox", &spec(false), &names(&["q_proj"])).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("`q_proj` matches no module of gpt_neox"), "{m}");
        assert!(
            m.contains("query_key_value") && m.contains("dense_4h_to_h"),
            "{m}"
        );
        let e = lora_targets("llama", &spec(true), &names(&["Wqkv"])).unwrap_err();
        assert!(e.to_string().contains("q_proj, k_proj"), "{e}");
    }

    #[test]
    fn an_adapter_config_gives_rank_alpha_dropout_and_targets() {
        let text = r#"{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                       "target_modules": ["v_proj", "q_proj"], "bias": "none",
                       "task_type": "CAUSAL_LM", "modules_to_save": null}"#;
        let a = read_adapter_config(text).unwrap();
        assert_eq!((a.rank, a.alpha, a.dropout), (16, 32.0, 0.05));
        let lora = a.lora("mistral", &spec(true)).unwrap();
        assert_eq!(lora.targets, vec![V, Q]);
        // no target_modules: peft's default for the family
        let a = read_adapter_config(r#"{"peft_type": "LORA", "r": 4}"#).unwrap();
        assert_eq!(a.lora("falcon", &spec(false)).unwrap().targets, vec![Qkv]);
        let a = read_adapter_config(r#"{"peft_type": "LORA", "target_modules": "all-linear"}"#)
            .unwrap();
        assert_eq!(
            a.lora("phi3", &spec(false)).unwrap().targets,
            vec![Qkv, O, GateUp, Down]
        );
    }

    #[test]
    fn other_adapters_and_unmodelled_settings_say_what_they_are() {
        let e = read_adapter_config(r#"{"peft_type": "IA3", "target_modules": ["k_proj"]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("a IA3 adapter"), "{e}");
        let e = read_adapter_config(r#"{"r": 8}"#).unwrap_err();
        assert!(e.to_string().contains("not a peft adapter"), "{e}");
        let e = read_adapter_config(r#"{"peft_type": "LORA", "use_dora": true}"#).unwrap_err();
        assert!(e.to_string().contains("DoRA"), "{e}");
        let e = read_adapter_config(r#"{"peft_type": "LORA", "modules_to_save": ["lm_head"]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("modules_to_save"), "{e}");
        let e = read_adapter_config(r#"{"peft_type": "LORA", "target_modules": ".*proj"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("regular expression"), "{e}");
    }
}
