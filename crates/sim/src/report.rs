//! Reports: the headline figures of a simulation, as text or JSON.

use std::fmt::Write as _;

use serde::Serialize;
use trainmem_core::Category;

use crate::engine::{SimResult, Summary};
use crate::explain::{Finding, explain};
use trainmem_core::bytes::human;
use trainmem_core::plan::Plan;

/// A serialisable report: summaries and findings.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The plan's name.
    pub name: String,
    /// The device with the highest peak.
    pub summary: Summary,
    /// One summary per pipeline stage.
    pub stages: Vec<Summary>,
    /// Patterns found.
    pub findings: Vec<Finding>,
    /// The CUDA context's bytes (0 on a CPU device).
    pub device_context: u64,
    /// Device memory as `nvidia-smi` reports it at the peak: the CUDA context plus the peak
    /// reserved bytes (0 on a CPU device, where there is neither).
    pub nvidia_smi_peak: u64,
}

/// Builds the report of a simulation.
pub fn report(plan: &Plan, r: &SimResult) -> Report {
    Report {
        name: plan.name.clone(),
        summary: r.summary.clone(),
        stages: r.stages.clone(),
        findings: explain(plan, &r.timeline, &r.summary),
        device_context: plan.device.context_bytes(),
        nvidia_smi_peak: nvidia_smi_peak(plan, &r.summary),
    }
}

/// The report as pretty JSON.
pub fn report_json(r: &Report) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(r)
}

/// Device memory as `nvidia-smi` reports it at the peak: the CUDA context plus the caching
/// allocator's peak reserved bytes, on a CUDA device; 0 on a CPU.
pub fn nvidia_smi_peak(plan: &Plan, s: &Summary) -> u64 {
    match plan.device.kind {
        trainmem_core::plan::DeviceKind::Cuda => plan.device.context_bytes() + s.peak_reserved,
        trainmem_core::plan::DeviceKind::Cpu => 0,
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Formats a report for a terminal: what was simulated, the peaks, the breakdown at the
/// peak, model state and fragmentation, the pipeline stages, a predicted OOM, the findings.
pub fn render_text(plan: &Plan, rep: &Report) -> String {
    let mut o = String::new();
    write_header(&mut o, plan, rep);
    write_peaks(&mut o, plan, &rep.summary);
    write_state(&mut o, &rep.summary);
    write_stages(&mut o, rep);
    if let Some(oom) = &rep.summary.oom {
        let _ = writeln!(
            o,
            "\nPREDICTED OUT OF MEMORY at step {} ({}):\n  {}",
            oom.when.step, oom.when.phase, oom.message
        );
    }
    write_findings(&mut o, rep);
    o
}

/// What was simulated: the plan's name, model, batch, dtype, optimizer and device.
fn write_header(o: &mut String, plan: &Plan, rep: &Report) {
    let s = &rep.summary;
    let name = if rep.name.is_empty() {
        "plan"
    } else {
        &rep.name
    };
    let _ = writeln!(o, "trainmem simulate: {name}");
    let precision = match plan.precision.autocast {
        Some(half) => format!("{} under autocast to {half}", plan.precision.compute),
        // mixed precision keeps f32 master weights beside the half-precision ones
        None if plan.precision.compute.is_half() && plan.precision.master_weights => {
            format!("{} with f32 master weights", plan.precision.compute)
        }
        None => plan.precision.compute.to_string(),
    };
    let _ = writeln!(
        o,
        "  model: {} ({} parameters), batch {} (micro-batch {} × {}), {precision}, {}",
        plan.model.kind_name(),
        trainmem_core::count::grouped(s.parameters),
        plan.training.batch_size,
        plan.micro_batch_size(),
        plan.accumulation_steps(),
        plan.optimizer.kind.name()
    );
    // the allocator's settings as PYTORCH_CUDA_ALLOC_CONF spells them, or its defaults
    let allocator = if plan.device.allocator.trim().is_empty() {
        "the caching allocator's defaults".to_string()
    } else {
        format!("allocator \"{}\"", plan.device.allocator)
    };
    let _ = writeln!(
        o,
        "  device: {} capacity, {allocator}; {} step(s) simulated, {} allocations",
        human(plan.device.capacity.0),
        s.steps,
        s.allocations
    );
}

/// The peaks (allocated with when, reserved, host RSS) and the breakdown at the peak.
fn write_peaks(o: &mut String, plan: &Plan, s: &Summary) {
    let cap = plan.device.capacity.0;
    let when = s
        .peak_when
        .map(|w| {
            format!(
                " at step {} ({}{})",
                w.step,
                w.phase,
                w.micro_batch
                    .map(|m| format!(", micro-batch {m}"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "\npeak allocated {} ({:.1}% of capacity){when}",
        human(s.peak_allocated),
        pct(s.peak_allocated, cap)
    );
    let _ = writeln!(
        o,
        "peak reserved  {} ({:.1}% of capacity)",
        human(s.peak_reserved),
        pct(s.peak_reserved, cap)
    );
    if plan.device.kind == trainmem_core::plan::DeviceKind::Cuda {
        let context = plan.device.context_bytes();
        let _ = writeln!(
            o,
            "device memory as nvidia-smi reports it: {} (CUDA context {} + peak reserved)",
            human(nvidia_smi_peak(plan, s)),
            human(context)
        );
    }
    let _ = writeln!(o, "peak host RSS  {}", human(s.peak_host_rss));
    let _ = writeln!(o, "\nat the peak (share of reserved):");
    let peak_total: u64 = Category::ALL
        .into_iter()
        .map(|c| s.peak_breakdown.get(c))
        .sum();
    for c in Category::ALL {
        let b = s.peak_breakdown.get(c);
        if b > 0 {
            let _ = writeln!(
                o,
                "  {:<16} {:>12}  {:5.1}%",
                c.name(),
                human(b),
                pct(b, peak_total.max(1))
            );
        }
    }
}

/// Model state per device and fragmentation at the end.
fn write_state(o: &mut String, s: &Summary) {
    let ms = &s.model_state;
    let _ = writeln!(
        o,
        "\nmodel state per device: parameters {} (of which master weights {}), gradients {}, optimizer state {}",
        human(ms.parameters),
        human(ms.master_weights),
        human(ms.gradients),
        human(ms.optimizer_state)
    );
    let f = &s.fragmentation;
    let _ = writeln!(
        o,
        "fragmentation at the end: {} cached but unallocated (largest free block {}, releasable by empty_cache {}, non-releasable {})",
        human(f.cached_unallocated),
        human(f.largest_free_block),
        human(f.releasable),
        human(f.non_releasable)
    );
}

/// One line per pipeline stage (with more than one).
fn write_stages(o: &mut String, rep: &Report) {
    if rep.stages.len() > 1 {
        let _ = writeln!(o, "\nper device (pipeline stages):");
        for st in &rep.stages {
            let _ = writeln!(
                o,
                "  stage {}: {} parameters, peak allocated {}, peak reserved {}",
                st.stage,
                st.parameters,
                human(st.peak_allocated),
                human(st.peak_reserved)
            );
        }
    }
}

/// The findings, one line each with the pattern's name.
fn write_findings(o: &mut String, rep: &Report) {
    if !rep.findings.is_empty() {
        let _ = writeln!(o, "\nwhat the timeline shows:");
        for fd in &rep.findings {
            let _ = writeln!(
                o,
                "  - [{}] {}",
                serde_json::to_value(fd.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                fd.text
            );
        }
    }
}
