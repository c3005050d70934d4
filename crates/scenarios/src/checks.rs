//! Small readers over a [`Timeline`] that scenario rules share: values at a phase, per step,
//! per category, in the domain that holds the tensors.

use trainmem_core::Category;
use trainmem_core::timeline::{Domain, Phase, Sample, Timeline};

/// The domain that holds the tensors in `t`: the device when any device bytes were recorded,
/// the host otherwise (a CPU backend, or the twin of a CPU plan).
pub fn tensor_domain(t: &Timeline) -> Domain {
    t.tensor_domain()
}

/// Bytes of `category` at sample `i` (tensor domain), or, when `None`, the run's own bytes:
/// every category except `cache` (not live) and `other` (untagged bookkeeping and whatever
/// other threads of the process allocate, which a rule about the run must not see).
pub fn bytes_at(t: &Timeline, i: usize, category: Option<Category>) -> u64 {
    bytes_in(t, tensor_domain(t), i, category)
}

/// [`bytes_at`] in host memory, whatever device holds the tensors: for what a run holds on
/// the host beside a GPU's tensors (a checkpoint's copy of the parameters).
pub fn host_bytes_at(t: &Timeline, i: usize, category: Option<Category>) -> u64 {
    bytes_in(t, Domain::Host, i, category)
}

/// [`bytes_at`] with the domain already known (for loops over many samples).
fn bytes_in(t: &Timeline, domain: Domain, i: usize, category: Option<Category>) -> u64 {
    let cats = t.categories(i, domain);
    match category {
        Some(c) => cats.get(c),
        None => cats.live() - cats.get(Category::Other),
    }
}

/// Host `input` bytes the program holds at sample `i`: the loader's batches in flight and in
/// hand, and the data set when preloaded. They live on the host whatever device holds the
/// tensors. Bytes a device backend still keeps after uploading a batch (the host side of the
/// copy, [`trainmem_core::timeline::HostBytes::handed_to_device`]) are not the program's and are
/// left out.
pub fn host_input(t: &Timeline, i: usize) -> u64 {
    t.samples[i].host.held(Category::Input)
}

/// Indices of the samples taken after `phase`, in order.
pub fn points(t: &Timeline, phase: Phase) -> Vec<usize> {
    t.indices_at(phase)
}

/// `bytes_at` for every sample after `phase`.
pub fn series_at(t: &Timeline, phase: Phase, category: Option<Category>) -> Vec<u64> {
    series_in(t, tensor_domain(t), phase, category)
}

/// [`series_at`] in host memory ([`host_bytes_at`]).
pub fn host_series_at(t: &Timeline, phase: Phase, category: Option<Category>) -> Vec<u64> {
    series_in(t, Domain::Host, phase, category)
}

fn series_in(t: &Timeline, domain: Domain, phase: Phase, category: Option<Category>) -> Vec<u64> {
    points(t, phase)
        .into_iter()
        .map(|i| bytes_in(t, domain, i, category))
        .collect()
}

/// The first sample after `phase` at optimizer step `step` ([`Timeline::first_index`]).
pub fn index_of(t: &Timeline, step: u64, phase: Phase) -> Option<usize> {
    t.first_index(step, phase)
}

/// The peak of `category` (or the live total) over the timeline, with its sample.
pub fn peak(t: &Timeline, category: Option<Category>) -> (u64, usize) {
    let domain = tensor_domain(t);
    (0..t.samples.len())
        .map(|i| (bytes_in(t, domain, i, category), i))
        .max_by_key(|&(b, i)| (b, std::cmp::Reverse(i)))
        .unwrap_or((0, 0))
}

/// Parameter bytes after model construction (0 when the run has no `model_init` sample).
pub fn param_bytes(t: &Timeline) -> u64 {
    index_of(t, 0, Phase::ModelInit)
        .map(|i| bytes_at(t, i, Some(Category::Parameter)))
        .unwrap_or(0)
}

/// A sample's place, for sentences (`epoch 1 step 7 after forward`).
pub fn place(s: &Sample) -> String {
    format!("epoch {} step {} after {}", s.epoch, s.step, s.phase.name())
}

/// `b - a` as a signed number.
pub fn delta(a: u64, b: u64) -> i64 {
    b as i64 - a as i64
}

/// Differences between consecutive values (`values[i + 1] - values[i]`), signed.
pub fn steps_of(values: &[u64]) -> Vec<i64> {
    values.windows(2).map(|w| delta(w[0], w[1])).collect()
}

/// Step-to-step differences of live bytes after the optimizer step.
pub fn growth_per_step(t: &Timeline) -> Vec<i64> {
    steps_of(&series_at(t, Phase::OptimizerStep, None))
}

/// Whether `x` is within `rel` (a fraction) of `reference`.
pub fn close(x: u64, reference: u64, rel: f64) -> bool {
    (x as f64 - reference as f64).abs() <= rel * reference as f64
}

/// Largest minus smallest value (0 for an empty slice).
pub fn spread(values: &[u64]) -> u64 {
    let max = values.iter().copied().max().unwrap_or(0);
    let min = values.iter().copied().min().unwrap_or(0);
    max - min
}

/// Builders of hand-made samples and timelines for the scenario rules' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use trainmem_core::Category;
    use trainmem_core::timeline::{Phase, Sample, Source, Timeline, TimelineMeta};

    /// A sample after `phase` at `step` of `epoch`, with `categories` set on the host and
    /// nothing on the device.
    pub fn sample(phase: Phase, step: u64, epoch: u64, categories: &[(Category, u64)]) -> Sample {
        let mut s = Sample {
            phase,
            step,
            epoch,
            micro_batch: None,
            time_us: 0.0,
            host: Default::default(),
            device: Default::default(),
        };
        for &(c, b) in categories {
            s.host.categories.set(c, b);
        }
        s
    }

    /// A timeline of `samples`, in order, from `source`.
    pub fn timeline(source: Source, samples: impl IntoIterator<Item = Sample>) -> Timeline {
        let mut t = Timeline::new(source, TimelineMeta::default());
        for s in samples {
            t.push(s);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{sample, timeline};
    use super::*;
    use trainmem_core::timeline::Source;

    fn t(device: bool) -> Timeline {
        let rows = [
            (0, Phase::Forward, 10u64),
            (0, Phase::Backward, 2),
            (1, Phase::Forward, 12),
        ];
        timeline(
            Source::Simulated,
            rows.into_iter().map(|(step, phase, act)| {
                if device {
                    let mut s = sample(phase, step, 0, &[]);
                    s.device.categories.set(Category::Activation, act);
                    s.device.categories.set(Category::Cache, 100);
                    s
                } else {
                    sample(phase, step, 0, &[(Category::Activation, act)])
                }
            }),
        )
    }

    #[test]
    fn readers_pick_the_tensor_domain_and_phases() {
        for device in [false, true] {
            let t = t(device);
            assert_eq!(
                tensor_domain(&t),
                if device { Domain::Device } else { Domain::Host }
            );
            assert_eq!(series_at(&t, Phase::Forward, None), vec![10, 12]);
            assert_eq!(peak(&t, Some(Category::Activation)), (12, 2));
            assert_eq!(index_of(&t, 0, Phase::Backward), Some(1));
            assert_eq!(spread(&[3, 9, 4]), 6);
        }
        assert!(close(105, 100, 0.05) && !close(106, 100, 0.05));
        assert_eq!(delta(5, 3), -2);
        assert_eq!(steps_of(&[5, 3, 10]), vec![-2, 7]);
        assert_eq!(steps_of(&[5]), Vec::<i64>::new());
    }
}
