//! trainmem-meta as a scenario's third source: the measured run's plan trained again on
//! `Autodiff<Meta>` with trainmem-burn's own loop (only the backend type differs), and its
//! tensor bytes per category held to the measured run's at every phase boundary.
//!
//! A Meta run is a prediction made by running burn's real training code with tensors that have
//! shapes and no data (`trainmem_burn::run_predicted` on trainmem-meta's `Meta`). Where the measured run is on burn's Flex
//! CPU backend, every tensor is host memory counted by trainmem-probe's allocator; on Meta the
//! tensors are the device's ledger (its device categories) and what is not a tensor (the
//! loader's buffers, bookkeeping) is counted on the host as in the measured run. So a boundary
//! compares the measured run's host bytes of a category with Meta's device plus host bytes of
//! the same category.
//!
//! Compared: [`COMPARED`] (parameters, gradients, optimizer state, activations, input).
//! `input` is left out when the loader has worker threads: how many batches sit in the
//! prefetch queue when a phase boundary is sampled depends on how the threads were scheduled,
//! in either run ([`Exclusion`] says so in the report). `temporary`, `cache` and `other` are
//! not tensor bytes (gemm's packing buffer, runtime state) and are not compared.
//!
//! Where the measured run's tensors are host memory (Flex), the records beside the tensors
//! (`HostBytes::records`: burn's graph, optimizer and module records, the loader's memory, made
//! outside the backend's ops) are compared too, category by category ([`MetaComparison::records`]):
//! burn runs the same code on Meta, so Meta predicts them.
//!
//! Tolerance at every boundary: 1% of the measured bytes plus the host count's resolution
//! ([`trainmem_core::compare::HOST_RESOLUTION`], 16 KiB: a few kilobytes of runtime state
//! created lazily land in whichever category the training thread carries at that moment).

use serde::Serialize;
use trainmem_burn::MeasuredRun;
use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::compare::HOST_RESOLUTION;
use trainmem_core::timeline::{CategoryBytes, Domain, Sample, Timeline};

/// The tensor categories compared.
pub const COMPARED: [Category; 5] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Activation,
    Category::Input,
];

/// Relative tolerance at every phase boundary.
pub const TOLERANCE: f64 = 0.01;

/// Absolute slack on top of [`TOLERANCE`]: the host count's resolution.
pub const SLACK: u64 = HOST_RESOLUTION;

/// One category of one run: the boundary where Meta is furthest from the measured run
/// (relative to what is allowed there), and how many boundaries were compared and missed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetaRow {
    /// The category.
    pub category: Category,
    /// The boundary shown (`e0 s3 forward`): the one furthest beyond the tolerance when any
    /// boundary is outside it, the category's measured peak otherwise.
    pub point: String,
    /// Measured bytes there.
    pub measured: u64,
    /// Meta's bytes there.
    pub meta: u64,
    /// `(meta - measured) / measured` there (`None` when measured is 0).
    pub error: Option<f64>,
    /// Phase boundaries compared.
    pub boundaries: usize,
    /// Boundaries outside the tolerance.
    pub outside: usize,
    /// The largest `|meta - measured|` in bytes over all boundaries.
    pub largest_difference: u64,
}

impl MetaRow {
    /// Whether every boundary is within the tolerance.
    pub fn within(&self) -> bool {
        self.outside == 0
    }
}

/// A category not compared for a run, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exclusion {
    /// The category.
    pub category: Category,
    /// Why it is not compared.
    pub reason: String,
}

/// Meta against the measured run, for one run of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetaComparison {
    /// One row per compared category.
    pub rows: Vec<MetaRow>,
    /// One row per compared category for the records beside the tensors (`host.records`),
    /// where the measured run's tensors are host memory; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<MetaRow>,
    /// Categories of [`COMPARED`] left out, with the reason.
    pub excluded: Vec<Exclusion>,
    /// Why the two timelines could not be laid side by side (different phase boundaries), when
    /// they could not: that is a disagreement too.
    pub mismatch: Option<String>,
}

impl MetaComparison {
    /// Whether Meta agrees with the measured run at every boundary of every compared category.
    pub fn agrees(&self) -> bool {
        self.mismatch.is_none()
            && !self.rows.is_empty()
            && self.rows.iter().chain(&self.records).all(MetaRow::within)
    }

    /// The rows outside the tolerance (tensor rows, then records rows).
    pub fn misses(&self) -> impl Iterator<Item = &MetaRow> {
        self.rows
            .iter()
            .chain(&self.records)
            .filter(|r| !r.within())
    }
}

/// The bytes allowed between Meta and a measured figure.
pub fn allowance(measured: u64) -> u64 {
    (measured as f64 * TOLERANCE) as u64 + SLACK
}

fn point(s: &Sample) -> String {
    let mut p = format!("e{} s{} {}", s.epoch, s.step, s.phase.name());
    if let Some(m) = s.micro_batch {
        p.push_str(&format!(" mb{m}"));
    }
    p
}

/// Meta's bytes of `category` at a boundary: tensors (device) plus host memory (the loader's
/// buffers).
fn meta_bytes(s: &Sample, category: Category) -> u64 {
    s.device.categories.get(category) + s.host.categories.get(category)
}

fn same_point(a: &Sample, b: &Sample) -> bool {
    (a.phase, a.step, a.epoch, a.micro_batch) == (b.phase, b.step, b.epoch, b.micro_batch)
}

/// What is left out of the comparison of a run of `plan`, and why.
pub fn exclusions(plan: &Plan, meta: &MeasuredRun) -> Vec<Exclusion> {
    let mut out = Vec::new();
    if plan.loader.workers > 0 {
        out.push(Exclusion {
            category: Category::Input,
            reason: format!(
                "{} loader worker thread(s): how many batches sit in the prefetch queue at a \
                 phase boundary depends on thread scheduling, in either run",
                plan.loader.workers
            ),
        });
    } else if !meta.host_counted {
        out.push(Exclusion {
            category: Category::Input,
            reason: "the process that ran Meta has no counting allocator, so the loader's host \
                     buffers of the Meta run were not counted"
                .to_string(),
        });
    }
    out
}

/// Compares `meta` (the plan trained on Meta) with `measured` (the same plan measured, its
/// tensors in `domain`) at every phase boundary.
pub fn compare(
    plan: &Plan,
    measured: &MeasuredRun,
    meta: &MeasuredRun,
    domain: Domain,
) -> MetaComparison {
    let excluded = exclusions(plan, meta);
    let m = &measured.timeline;
    let t = &meta.timeline;
    let mismatch = boundary_mismatch(m, t);
    if mismatch.is_some() {
        return MetaComparison {
            rows: Vec::new(),
            records: Vec::new(),
            excluded,
            mismatch,
        };
    }
    let compared: Vec<Category> = COMPARED
        .iter()
        .copied()
        .filter(|c| !excluded.iter().any(|e| e.category == *c))
        .collect();
    let rows = compared
        .iter()
        .map(|&category| category_row(m, t, category, |i| m.categories(i, domain), meta_bytes))
        .collect();
    let measured_records = m.samples.iter().any(|s| !s.host.records.is_zero());
    let records = if domain == Domain::Host && measured_records {
        compared
            .iter()
            .map(|&category| {
                category_row(
                    m,
                    t,
                    category,
                    |i| m.samples[i].host.records,
                    |s, c| s.host.records.get(c),
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    MetaComparison {
        rows,
        records,
        excluded,
        mismatch: None,
    }
}

/// Where the two runs' phase boundaries stop lining up (a different count, or a boundary that
/// is another phase or step), in words; `None` when they line up.
fn boundary_mismatch(m: &Timeline, t: &Timeline) -> Option<String> {
    if m.samples.len() != t.samples.len() {
        Some(format!(
            "{} phase boundaries measured, {} on Meta",
            m.samples.len(),
            t.samples.len()
        ))
    } else {
        m.samples
            .iter()
            .zip(&t.samples)
            .position(|(a, b)| !same_point(a, b))
            .map(|i| {
                format!(
                    "boundary {i} is `{}` measured and `{}` on Meta",
                    point(&m.samples[i]),
                    point(&t.samples[i])
                )
            })
    }
}

/// One category compared at every boundary: how many are outside the allowance, the largest
/// difference, and the boundary shown (the furthest beyond the limit, else the measured peak).
/// `measured(i)` gives the measured run's bytes per category at boundary `i`, `meta(sample,
/// category)` Meta's.
fn category_row(
    m: &Timeline,
    t: &Timeline,
    category: Category,
    measured: impl Fn(usize) -> CategoryBytes,
    meta: impl Fn(&Sample, Category) -> u64,
) -> MetaRow {
    let mut row = MetaRow {
        category,
        point: String::new(),
        measured: 0,
        meta: 0,
        error: None,
        boundaries: 0,
        outside: 0,
        largest_difference: 0,
    };
    // The boundary shown: the one furthest beyond the limit when there is a miss, the
    // category's measured peak otherwise.
    let mut by_limit: Option<(f64, usize)> = None;
    let mut peak: Option<(u64, usize)> = None;
    for (i, b) in t.samples.iter().enumerate() {
        let measured_bytes = measured(i).get(category);
        let diff = measured_bytes.abs_diff(meta(b, category));
        let allowed = allowance(measured_bytes);
        row.boundaries += 1;
        if diff > allowed {
            row.outside += 1;
        }
        if diff > row.largest_difference {
            row.largest_difference = diff;
        }
        let score = diff as f64 / allowed as f64;
        if by_limit.is_none_or(|(s, _)| score > s) {
            by_limit = Some((score, i));
        }
        if peak.is_none_or(|(p, _)| measured_bytes > p) {
            peak = Some((measured_bytes, i));
        }
    }
    let shown = if row.outside > 0 {
        by_limit.map(|(_, i)| i)
    } else {
        peak.map(|(_, i)| i)
    };
    if let Some(i) = shown {
        let measured_bytes = measured(i).get(category);
        let meta_there = meta(&t.samples[i], category);
        row.point = point(&m.samples[i]);
        row.measured = measured_bytes;
        row.meta = meta_there;
        row.error = (measured_bytes > 0)
            .then(|| (meta_there as f64 - measured_bytes as f64) / measured_bytes as f64);
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_core::timeline::{Phase, Source, Timeline, TimelineMeta};

    fn run(source: Source, values: &[(Phase, u64, u64)], on_device: bool) -> MeasuredRun {
        let mut t = Timeline::new(source, TimelineMeta::default());
        for &(phase, params, act) in values {
            let mut s = Sample::new(phase, 0);
            let cats = if on_device {
                &mut s.device.categories
            } else {
                &mut s.host.categories
            };
            cats.set(Category::Parameter, params);
            cats.set(Category::Activation, act);
            t.push(s);
        }
        MeasuredRun {
            timeline: t,
            samples: Vec::new(),
            parameter_bytes: 0,
            host_counted: true,
            checkpoints: Vec::new(),
            checkpoint_sizes: Vec::new(),
            loader_threads_spawned: None,
            loader_memory: Vec::new(),
            loader_peak: None,
            staging_pinned: None,
            preloaded_bytes: 0,
            lazy_parameters_at_init: 0,
            allocation_trace: Vec::new(),
            allocation_trace_dropped: 0,
            training_thread: 0,
        }
    }

    fn plan(workers: u64) -> Plan {
        Plan::from_toml_str(&format!(
            "[model.mlp]\ninput = 2\nhidden = []\noutput = 2\n[loader]\nworkers = {workers}\n"
        ))
        .expect("plan")
    }

    #[test]
    fn meta_within_one_percent_plus_the_resolution_agrees_and_beyond_it_does_not() {
        let measured = run(
            Source::Measured,
            &[
                (Phase::Forward, 10 << 20, 4 << 20),
                (Phase::Backward, 10 << 20, 0),
            ],
            false,
        );
        // 0.9% more parameters, and 16 KiB of activations where none were measured.
        let close = run(
            Source::Simulated,
            &[
                (Phase::Forward, (10 << 20) + 94_000, 4 << 20),
                (Phase::Backward, 10 << 20, 16 << 10),
            ],
            true,
        );
        let c = compare(&plan(0), &measured, &close, Domain::Host);
        assert!(c.agrees(), "{c:?}");
        let p = &c.rows[0];
        assert_eq!(
            (p.category, p.point.as_str()),
            (Category::Parameter, "e0 s0 forward")
        );
        assert_eq!((p.boundaries, p.largest_difference), (2, 94_000));
        let a = &c.rows[3];
        assert_eq!(a.category, Category::Activation);
        assert_eq!((a.point.as_str(), a.error), ("e0 s0 forward", Some(0.0)));
        assert_eq!(a.largest_difference, 16 << 10);
        // 2% more activations after forward: one boundary outside.
        let far = run(
            Source::Simulated,
            &[
                (Phase::Forward, 10 << 20, (4 << 20) + (84 << 10)),
                (Phase::Backward, 10 << 20, 0),
            ],
            true,
        );
        let c = compare(&plan(0), &measured, &far, Domain::Host);
        assert!(!c.agrees());
        let act: Vec<&MetaRow> = c.misses().collect();
        assert_eq!(act.len(), 1);
        assert_eq!((act[0].category, act[0].outside), (Category::Activation, 1));
        assert!((act[0].error.unwrap_or(0.0) - 0.0205).abs() < 1e-3);
    }

    /// Sets the activation records of every sample of `run`.
    fn with_records(mut run: MeasuredRun, records: &[u64]) -> MeasuredRun {
        for (s, &r) in run.timeline.samples.iter_mut().zip(records) {
            s.host.records.set(Category::Activation, r);
        }
        run
    }

    #[test]
    fn the_records_are_compared_where_the_tensors_are_host_memory() {
        let values = [
            (Phase::Forward, 1 << 20, 1 << 20),
            (Phase::Backward, 1 << 20, 0),
        ];
        let measured = with_records(run(Source::Measured, &values, false), &[200_000, 8_000]);
        let near = with_records(run(Source::Simulated, &values, true), &[190_000, 0]);
        let c = compare(&plan(0), &measured, &near, Domain::Host);
        assert!(c.agrees(), "{c:?}");
        assert_eq!(c.records.len(), c.rows.len());
        let act = c
            .records
            .iter()
            .find(|r| r.category == Category::Activation)
            .expect("activation records");
        assert_eq!(
            (act.largest_difference, act.point.as_str()),
            (10_000, "e0 s0 forward")
        );
        // 40 KB short of the forward's records: outside 1% + 16 KiB.
        let short = with_records(run(Source::Simulated, &values, true), &[160_000, 8_000]);
        let c = compare(&plan(0), &measured, &short, Domain::Host);
        assert!(!c.agrees());
        assert_eq!(c.misses().count(), 1);
        // Tensors on a device, or no records measured: nothing to compare.
        let c = compare(&plan(0), &measured, &short, Domain::Device);
        assert!(c.records.is_empty());
        let bare = run(Source::Measured, &values, false);
        assert!(
            compare(&plan(0), &bare, &short, Domain::Host)
                .records
                .is_empty()
        );
    }

    #[test]
    fn input_is_left_out_with_loader_workers_and_misaligned_timelines_disagree() {
        let measured = run(Source::Measured, &[(Phase::Forward, 1, 1)], false);
        let meta = run(Source::Simulated, &[(Phase::Forward, 1, 1)], true);
        let c = compare(&plan(2), &measured, &meta, Domain::Host);
        assert_eq!(c.excluded.len(), 1);
        assert_eq!(c.excluded[0].category, Category::Input);
        assert!(c.rows.iter().all(|r| r.category != Category::Input));
        assert_eq!(
            compare(&plan(0), &measured, &meta, Domain::Host).rows.len(),
            5
        );
        let longer = run(
            Source::Simulated,
            &[(Phase::Forward, 1, 1), (Phase::Backward, 1, 1)],
            true,
        );
        let c = compare(&plan(0), &measured, &longer, Domain::Host);
        assert!(!c.agrees());
        assert!(c.mismatch.is_some());
        let other = run(Source::Simulated, &[(Phase::Backward, 1, 1)], true);
        assert!(!compare(&plan(0), &measured, &other, Domain::Host).agrees());
    }
}
