//! The line of the model's code that made most of the activations live at the peak, and how
//! many separate times it ran: a line inside a repeated block (a transformer layer's norm or
//! MLP) runs once per block, which is what activation checkpointing per block trades. Counting
//! the line's executions, not its allocations, keeps a line that allocates many tensors at once
//! (a notebook cell calling the whole model) from passing for many blocks.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_core::Category;

use super::frames::{model_line, site_name};
use super::lifetimes::Lifetimes;

/// The model line behind most activation bytes at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepeatedLine {
    /// `file:line function` of the model's code ([`model_line`]).
    pub line: String,
    /// Activation bytes live at that moment that it made.
    pub bytes: u64,
    /// Separate executions of the line that made them: allocations made one after another
    /// from the line, with no other line's allocation between them, are one execution.
    pub runs: u64,
}

/// The model line behind most activation bytes live after trace entry `at` (None when no live
/// activation has a model line in its stack).
pub fn repeated_line(f: &FramedSnapshot, lt: &Lifetimes, at: usize) -> Option<RepeatedLine> {
    // each stack's model line, as an index into `lines`
    let mut lines: Vec<String> = Vec::new();
    let mut line_ids: HashMap<String, u32> = HashMap::new();
    let mut of_stack: HashMap<u32, Option<u32>> = HashMap::new();
    let mut line_of = |stack: u32| -> Option<u32> {
        *of_stack.entry(stack).or_insert_with(|| {
            let name = site_name(model_line(f.stack(stack))?);
            let next = lines.len() as u32;
            let id = *line_ids.entry(name.clone()).or_insert(next);
            if id == next {
                lines.push(name);
            }
            Some(id)
        })
    };
    // executions: a new one starts wherever the line differs from the previous allocation's
    let mut order: Vec<(usize, usize)> = lt
        .allocations
        .iter()
        .enumerate()
        .filter_map(|(i, a)| a.alloc_at.map(|k| (k, i)))
        .collect();
    order.sort_unstable();
    let mut run_of = vec![0u32; lt.allocations.len()];
    let mut line = vec![None; lt.allocations.len()];
    let (mut run, mut previous) = (0u32, None);
    for (_, i) in order {
        let here = line_of(lt.allocations[i].stack);
        if run == 0 || previous != here {
            run += 1;
            previous = here;
        }
        run_of[i] = run;
        line[i] = here;
    }
    let mut at_peak: HashMap<u32, (u64, HashSet<u32>)> = HashMap::new();
    for (i, a) in lt.allocations.iter().enumerate() {
        if a.category != Category::Activation || a.alloc_at.is_none() || !a.live_after(at) {
            continue;
        }
        if let Some(l) = line[i] {
            let e = at_peak.entry(l).or_default();
            e.0 += a.size;
            e.1.insert(run_of[i]);
        }
    }
    at_peak
        .into_iter()
        .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.0.cmp(&a.0)))
        .map(|(l, (bytes, runs))| RepeatedLine {
            line: lines[l as usize].clone(),
            bytes,
            runs: runs.len() as u64,
        })
}
