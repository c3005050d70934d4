//! `explain`'s categories held against PyTorch's own: torch.profiler's memory profiler
//! categorizes every storage of a profiled run from the run's data flow (what feeds a
//! gradient, what an optimizer's state holds, which ops ran in backward), with no stack and no
//! lifetime rule. `validation/pytorch/profile_truth.py` writes a run's snapshot and, beside it,
//! the profiler's category of every `alloc` entry (`NAME.truth.json`); [`compare`] explains the
//! snapshot and sets the two side by side, by bytes.
//!
//! The two name some bytes differently by definition, not by mistake. The profiler names a
//! storage by where its data flows; trainmem by the phase that made it and the phase that
//! freed it. [`expected`] puts the profiler's category in trainmem's words with the calls
//! the profiler's own Python tracer saw (the outermost module calls, `Tensor.backward`, an
//! optimizer's `step`), so the rules use nothing trainmem decided:
//!
//! * made and freed inside one of those calls, or made and freed before the first forward
//!   pass: a `temporary`, whatever its data flow (an optimizer step's scratch, computed from
//!   its state, is a "parameter" or an "activation" to the profiler; a model's f32 weights
//!   replaced by a cast are its "parameters");
//! * the profiler's `activation` is every tensor the forward pass computes from the batch;
//!   trainmem's is what the forward pass keeps for backward. One freed before the next
//!   `Tensor.backward` began is a `temporary`;
//! * the profiler's `input` is what does not depend on a gradient: a module's forward makes
//!   some (rotary tables, the key/value cache's copies), named by lifetime like an
//!   activation; a buffer made before the first forward and kept is `other`;
//! * `autograd_detail` is what backward's own functions make that is not a gradient of a
//!   parameter (the activations' gradients, backward's scratch): a `temporary`;
//! * a storage whose versions the profiler left without a category (its data flow decided
//!   nothing), or whose versions it named differently, is counted apart and not compared.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_core::Category;

use super::{ExplainError, ExplainOptions, SnapshotExplanation, explain_snapshot};

/// A category torch.profiler's memory profiler gives a storage's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfilerCategory {
    /// A module's parameter.
    Parameter,
    /// A parameter's `.grad`.
    Gradient,
    /// What an optimizer's `state` holds.
    OptimizerState,
    /// Computed in the forward pass from the batch.
    Activation,
    /// The batch, and what is computed from it without depending on a gradient.
    Input,
    /// Made and freed inside one op.
    Temporary,
    /// Made by backward's functions, not a parameter's gradient.
    AutogradDetail,
}

impl ProfilerCategory {
    /// The profiler's name for it.
    pub fn name(self) -> &'static str {
        match self {
            ProfilerCategory::Parameter => "parameter",
            ProfilerCategory::Gradient => "gradient",
            ProfilerCategory::OptimizerState => "optimizer_state",
            ProfilerCategory::Activation => "activation",
            ProfilerCategory::Input => "input",
            ProfilerCategory::Temporary => "temporary",
            ProfilerCategory::AutogradDetail => "autograd_detail",
        }
    }
}

/// One allocation of the snapshot with the profiler's verdict.
#[derive(Debug, Clone, Deserialize)]
pub struct TruthEntry {
    /// Index of its `alloc` entry in the device trace.
    pub alloc_at: usize,
    /// Bytes (the trace entry's size).
    pub size: u64,
    /// The profiler's category of each version of the storage, in order (None: undecided).
    pub categories: Vec<Option<ProfilerCategory>>,
}

/// A profiled run: `NAME.truth.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct ProfilerTruth {
    /// The run.
    pub name: String,
    /// Where it ran (`cpu`, or the GPU's name).
    pub device: String,
    /// How its snapshot was made.
    pub snapshot: String,
    /// Package versions.
    #[serde(default)]
    pub versions: BTreeMap<String, String>,
    /// (first, last) trace entry of each outermost module call, in order.
    pub forward: Vec<(usize, usize)>,
    /// (first, last) trace entry of each `Tensor.backward` call, in order.
    pub backward: Vec<(usize, usize)>,
    /// (first, last) trace entry of each optimizer `step` call, in order.
    pub optimizer_step: Vec<(usize, usize)>,
    /// Every allocation the profiler saw on the device.
    pub entries: Vec<TruthEntry>,
}

/// Reading a truth file failed.
#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    /// Not the JSON `profile_truth.py` writes.
    #[error("not a torch.profiler truth file: {0}")]
    Json(#[from] serde_json::Error),
    /// An entry names no `alloc` of the snapshot.
    #[error(
        "truth entry {index} names trace entry {alloc_at}, which is not an allocation the explanation holds"
    )]
    NoSuchAllocation {
        /// The truth entry.
        index: usize,
        /// The trace entry it names.
        alloc_at: usize,
    },
    /// Explaining the snapshot failed.
    #[error(transparent)]
    Explain(#[from] ExplainError),
    /// A file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The snapshot beside a truth file could not be read.
    #[error("{path}: {source}")]
    Snapshot {
        /// The snapshot.
        path: String,
        /// Why.
        source: trainmem_alloc::pytorch::framed::FramedError,
    },
}

/// A profiled run as found on disk: its truth and its snapshot.
pub struct ProfiledRun {
    /// `NAME.truth.json`.
    pub truth: ProfilerTruth,
    /// `NAME.pickle`.
    pub snapshot: FramedSnapshot,
}

/// The profiled runs under `dir` and its folders one level down (`fixtures/pytorch-profiled/`
/// holds one folder per device), in order of path: every `NAME.truth.json` with the
/// `NAME.pickle` beside it.
pub fn profiled_runs(dir: &Path) -> Result<Vec<ProfiledRun>, TruthError> {
    let file = |path: &Path| {
        let path = path.display().to_string();
        move |source| TruthError::File { path, source }
    };
    let mut folders = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).map_err(file(dir))? {
        let path = entry.map_err(file(dir))?.path();
        if path.is_dir() {
            folders.push(path);
        }
    }
    let mut truths = Vec::new();
    for folder in folders {
        for entry in std::fs::read_dir(&folder).map_err(file(&folder))? {
            let path = entry.map_err(file(&folder))?.path();
            if path.to_string_lossy().ends_with(".truth.json") {
                truths.push(path);
            }
        }
    }
    truths.sort();
    let mut runs = Vec::new();
    for path in truths {
        let truth = ProfilerTruth::read(&std::fs::read_to_string(&path).map_err(file(&path))?)?;
        let pickle = PathBuf::from(path.to_string_lossy().replace(".truth.json", ".pickle"));
        let bytes = std::fs::read(&pickle).map_err(file(&pickle))?;
        let snapshot = FramedSnapshot::read(&bytes).map_err(|source| TruthError::Snapshot {
            path: pickle.display().to_string(),
            source,
        })?;
        runs.push(ProfiledRun { truth, snapshot });
    }
    Ok(runs)
}

/// The comparisons as a table: one row per run, with frames and without.
pub fn render_table(rows: &[(ProfilerComparison, ProfilerComparison)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<34} {:<24} {:>11} {:>9} {:>9} {:>9} {:>11} {:>9}",
        "run", "device", "compared B", "all", "at peak", "dataflow", "undecided B", "no frames"
    );
    for (c, bare) in rows {
        let _ = writeln!(
            out,
            "{:<34} {:<24} {:>11} {:>8.2}% {:>8.2}% {:>8.2}% {:>11} {:>8.2}%",
            c.name,
            c.device,
            c.all.compared,
            100.0 * c.all.share(),
            100.0 * c.at_peak.share(),
            100.0 * c.by_data_flow.share(),
            c.undecided + c.mixed,
            100.0 * bare.at_peak.share(),
        );
    }
    out
}

impl ProfilerTruth {
    /// Reads `NAME.truth.json`.
    pub fn read(json: &str) -> Result<ProfilerTruth, TruthError> {
        Ok(serde_json::from_str(json)?)
    }
}

/// Where the profiler's tracer saw an allocation made and freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lifetime {
    /// Made inside a module's forward call.
    pub made_in_forward: bool,
    /// Made before the first forward call began.
    pub made_before_first_forward: bool,
    /// Freed inside the very call (forward, backward, optimizer step) that made it, or made
    /// and freed before the first forward call.
    pub freed_where_made: bool,
    /// Freed before the next `Tensor.backward` after it was made began.
    pub freed_before_backward: bool,
    /// Never freed.
    pub kept: bool,
}

/// What trainmem calls bytes the profiler calls `p`, given where they lived.
pub fn expected(p: ProfilerCategory, life: Lifetime) -> Category {
    use ProfilerCategory as P;
    let by_lifetime = if life.freed_before_backward {
        Category::Temporary
    } else {
        Category::Activation
    };
    if life.freed_where_made {
        return Category::Temporary;
    }
    match p {
        P::Parameter => Category::Parameter,
        P::Gradient => Category::Gradient,
        P::OptimizerState => Category::OptimizerState,
        P::Activation => by_lifetime,
        P::Input if life.made_in_forward => by_lifetime,
        P::Input if life.made_before_first_forward && life.kept => Category::Other,
        P::Input => Category::Input,
        P::Temporary | P::AutogradDetail => Category::Temporary,
    }
}

/// The call of `ranges` (first, last entry) that holds entry `e`.
fn call_holding(ranges: &[(usize, usize)], e: usize) -> Option<usize> {
    let i = ranges.partition_point(|r| r.0 <= e);
    (i > 0 && e <= ranges[i - 1].1).then(|| i - 1)
}

impl ProfilerTruth {
    /// Where the allocation made at entry `made` and freed at `freed` lived.
    pub fn lifetime(&self, made: usize, freed: Option<usize>) -> Lifetime {
        let first_forward = self.forward.first().map_or(usize::MAX, |r| r.0);
        let same_call = |ranges: &[(usize, usize)]| {
            let m = call_holding(ranges, made);
            m.is_some() && freed.is_some_and(|f| call_holding(ranges, f) == m)
        };
        let next_backward = self.backward.iter().find(|r| r.0 > made).map(|r| r.0);
        Lifetime {
            made_in_forward: call_holding(&self.forward, made).is_some(),
            made_before_first_forward: made < first_forward,
            freed_where_made: same_call(&self.forward)
                || same_call(&self.backward)
                || same_call(&self.optimizer_step)
                || (made < first_forward && freed.is_some_and(|f| f < first_forward)),
            freed_before_backward: match (freed, next_backward) {
                (Some(f), Some(b)) => f < b,
                (Some(_), None) => true,
                (None, _) => false,
            },
            kept: freed.is_none(),
        }
    }
}

/// Bytes on both sides, and those on which they agree.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Agreed {
    /// Bytes the profiler decided with one category.
    pub compared: u64,
    /// Of those, bytes trainmem gave the expected category.
    pub agreed: u64,
}

impl Agreed {
    fn add(&mut self, bytes: u64, agreed: bool) {
        self.compared += bytes;
        if agreed {
            self.agreed += bytes;
        }
    }

    /// Share of the compared bytes agreed on (1 when none were compared).
    pub fn share(&self) -> f64 {
        if self.compared == 0 {
            1.0
        } else {
            self.agreed as f64 / self.compared as f64
        }
    }
}

/// One run's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct ProfilerComparison {
    /// The run.
    pub name: String,
    /// Where it ran.
    pub device: String,
    /// Over every allocation of the run.
    pub all: Agreed,
    /// Over the allocations live at the explanation's peak.
    pub at_peak: Agreed,
    /// Over the allocations the profiler's data flow names (every one but those made and
    /// freed inside one call, which trainmem's words name by lifetime alone).
    pub by_data_flow: Agreed,
    /// Bytes live at the peak per category: the profiler's (mapped by [`expected`]) and
    /// trainmem's, over the compared allocations.
    pub peak_by_category: Vec<(Category, u64, u64)>,
    /// Bytes per (profiler category, trainmem category) over every compared allocation.
    pub confusion: Vec<(ProfilerCategory, Category, u64)>,
    /// Bytes the profiler left without a category.
    pub undecided: u64,
    /// Bytes whose versions the profiler named differently.
    pub mixed: u64,
    /// Every allocation's bytes.
    pub total: u64,
    /// The allocations they disagree on: (alloc entry, bytes, the profiler's category,
    /// what that means in trainmem's words, trainmem's category).
    pub disagreements: Vec<(usize, u64, ProfilerCategory, Category, Category)>,
}

/// The profiler's single category of an entry: None when it decided none, Err when its
/// versions disagree.
fn single(e: &TruthEntry) -> Result<Option<ProfilerCategory>, ()> {
    let mut found = None;
    for c in e.categories.iter().flatten() {
        match found {
            None => found = Some(*c),
            Some(f) if f == *c => {}
            Some(_) => return Err(()),
        }
    }
    Ok(found)
}

/// Explains `snapshot` as `trainmem explain` does and sets its categories beside `truth`'s.
pub fn compare(
    snapshot: &FramedSnapshot,
    truth: &ProfilerTruth,
) -> Result<ProfilerComparison, TruthError> {
    let opts = ExplainOptions {
        replay_remedies: false,
        ..ExplainOptions::default()
    };
    compare_explained(&explain_snapshot(snapshot, &opts)?, truth)
}

/// [`compare`] with every stack of `snapshot` left out, as a snapshot recorded without
/// frames (`_record_memory_history(stacks=...)` off, or a trace stripped of them) is read:
/// lifetimes alone decide.
pub fn compare_without_frames(
    snapshot: &FramedSnapshot,
    truth: &ProfilerTruth,
) -> Result<ProfilerComparison, TruthError> {
    compare(&snapshot.without_stacks(), truth)
}

fn compare_explained(
    ex: &SnapshotExplanation,
    truth: &ProfilerTruth,
) -> Result<ProfilerComparison, TruthError> {
    let mut by_alloc = vec![None; ex.entry_allocation.len()];
    for (i, a) in ex.allocations.iter().enumerate() {
        if let Some(at) = a.alloc_at
            && at < by_alloc.len()
        {
            by_alloc[at] = Some(i);
        }
    }
    let peak = ex.peak.entry;
    let mut all = Agreed::default();
    let mut at_peak = Agreed::default();
    let mut by_data_flow = Agreed::default();
    let mut confusion: BTreeMap<(ProfilerCategory, Category), u64> = BTreeMap::new();
    let mut peak_by: BTreeMap<Category, (u64, u64)> = BTreeMap::new();
    let (mut undecided, mut mixed, mut total) = (0, 0, 0);
    let mut disagreements = Vec::new();
    for (index, e) in truth.entries.iter().enumerate() {
        let a = by_alloc
            .get(e.alloc_at)
            .copied()
            .flatten()
            .map(|i| &ex.allocations[i])
            .ok_or(TruthError::NoSuchAllocation {
                index,
                alloc_at: e.alloc_at,
            })?;
        total += e.size;
        let p = match single(e) {
            Ok(Some(p)) => p,
            Ok(None) => {
                undecided += e.size;
                continue;
            }
            Err(()) => {
                mixed += e.size;
                continue;
            }
        };
        let life = truth.lifetime(e.alloc_at, a.free_at);
        let want = expected(p, life);
        let right = a.category == want;
        all.add(e.size, right);
        if !life.freed_where_made {
            by_data_flow.add(e.size, right);
        }
        *confusion.entry((p, a.category)).or_default() += e.size;
        if !right {
            disagreements.push((e.alloc_at, e.size, p, want, a.category));
        }
        if a.live_after(peak) {
            at_peak.add(e.size, right);
            peak_by.entry(want).or_default().0 += e.size;
            peak_by.entry(a.category).or_default().1 += e.size;
        }
    }
    Ok(ProfilerComparison {
        name: truth.name.clone(),
        device: truth.device.clone(),
        all,
        at_peak,
        by_data_flow,
        peak_by_category: peak_by.into_iter().map(|(c, (p, t))| (c, p, t)).collect(),
        confusion: confusion.into_iter().map(|((p, c), b)| (p, c, b)).collect(),
        undecided,
        mixed,
        total,
        disagreements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profiler_s_words_map_onto_trainmem_s() {
        use ProfilerCategory as P;
        let kept_for_backward = Lifetime::default();
        let gone_before_backward = Lifetime {
            freed_before_backward: true,
            ..Lifetime::default()
        };
        assert_eq!(
            expected(P::Activation, kept_for_backward),
            Category::Activation
        );
        assert_eq!(
            expected(P::Activation, gone_before_backward),
            Category::Temporary
        );
        assert_eq!(
            expected(P::AutogradDetail, kept_for_backward),
            Category::Temporary
        );
        assert_eq!(expected(P::Input, gone_before_backward), Category::Input);
        let in_forward = Lifetime {
            made_in_forward: true,
            ..Lifetime::default()
        };
        assert_eq!(expected(P::Input, in_forward), Category::Activation);
        let step_scratch = Lifetime {
            freed_where_made: true,
            freed_before_backward: true,
            ..Lifetime::default()
        };
        assert_eq!(expected(P::Parameter, step_scratch), Category::Temporary);
        assert_eq!(
            expected(P::Gradient, gone_before_backward),
            Category::Gradient
        );
    }

    #[test]
    fn lifetimes_are_read_from_the_tracer_s_calls() {
        let truth = ProfilerTruth {
            name: "t".into(),
            device: "cpu".into(),
            snapshot: String::new(),
            versions: BTreeMap::new(),
            forward: vec![(10, 19), (50, 59)],
            backward: vec![(20, 29), (60, 69)],
            optimizer_step: vec![(30, 39), (70, 79)],
            entries: Vec::new(),
        };
        // made and freed in setup, in one forward, in one step
        assert!(truth.lifetime(2, Some(5)).freed_where_made);
        assert!(truth.lifetime(11, Some(18)).freed_where_made);
        assert!(truth.lifetime(31, Some(39)).freed_where_made);
        // saved by the first forward for its backward
        let saved = truth.lifetime(12, Some(25));
        assert!(saved.made_in_forward && !saved.freed_where_made && !saved.freed_before_backward);
        // made in the first forward, freed in the second: not the same call
        assert!(!truth.lifetime(12, Some(55)).freed_where_made);
        // a batch made between steps, freed after the next backward
        let batch = truth.lifetime(45, Some(65));
        assert!(!batch.made_in_forward && !batch.made_before_first_forward);
        // kept: a parameter made in setup
        let kept = truth.lifetime(1, None);
        assert!(kept.kept && kept.made_before_first_forward && !kept.freed_where_made);
    }

    #[test]
    fn versions_named_differently_are_not_compared() {
        let e = |c: Vec<Option<ProfilerCategory>>| TruthEntry {
            alloc_at: 0,
            size: 1,
            categories: c,
        };
        use ProfilerCategory as P;
        assert_eq!(single(&e(vec![None, Some(P::Input)])), Ok(Some(P::Input)));
        assert_eq!(single(&e(vec![None])), Ok(None));
        assert_eq!(
            single(&e(vec![Some(P::Input), Some(P::Activation)])),
            Err(())
        );
    }

    #[test]
    fn a_file_that_is_not_a_truth_file_is_a_clear_error() {
        let err = ProfilerTruth::read("{\"name\": 3}").unwrap_err();
        assert!(err.to_string().contains("not a torch.profiler truth file"));
    }
}
