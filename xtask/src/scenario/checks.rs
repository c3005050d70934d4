//! Small readers over a [`Timeline`] that scenario rules share: values at a phase, per step,
//! per category, in the domain that holds the tensors.

use trainmem_probe::Category;
use trainmem_sim::timeline::{Domain, Phase, Sample, Timeline};

/// The domain that holds the tensors in `t`: the device when any device bytes were recorded,
/// the host otherwise (a CPU backend, or the twin of a CPU plan).
pub fn tensor_domain(t: &Timeline) -> Domain {
    let on_device = t
        .samples
        .iter()
        .any(|s| s.device.categories.total() > 0 || s.device.reserved > 0);
    if on_device {
        Domain::Device
    } else {
        Domain::Host
    }
}

/// Bytes of `category` at sample `i` (tensor domain), or, when `None`, the run's own bytes:
/// every category except `cache` (not live) and `other` (untagged bookkeeping and whatever
/// other threads of the process allocate, which a rule about the run must not see).
pub fn bytes_at(t: &Timeline, i: usize, category: Option<Category>) -> u64 {
    let cats = t.categories(i, tensor_domain(t));
    match category {
        Some(c) => cats.get(c),
        None => cats.live() - cats.get(Category::Other),
    }
}

/// Indices of the samples taken after `phase`, in order.
pub fn points(t: &Timeline, phase: Phase) -> Vec<usize> {
    t.indices_at(phase)
}

/// `bytes_at` for every sample after `phase`.
pub fn series_at(t: &Timeline, phase: Phase, category: Option<Category>) -> Vec<u64> {
    points(t, phase)
        .into_iter()
        .map(|i| bytes_at(t, i, category))
        .collect()
}

/// The first sample after `phase` at optimizer step `step`.
pub fn index_of(t: &Timeline, step: u64, phase: Phase) -> Option<usize> {
    t.samples
        .iter()
        .position(|s| s.step == step && s.phase == phase)
}

/// The peak of `category` (or the live total) over the timeline, with its sample.
pub fn peak(t: &Timeline, category: Option<Category>) -> (u64, usize) {
    (0..t.samples.len())
        .map(|i| (bytes_at(t, i, category), i))
        .max_by_key(|&(b, i)| (b, std::cmp::Reverse(i)))
        .unwrap_or((0, 0))
}

/// A sample's place, for sentences (`epoch 1 step 7 after forward`).
pub fn place(s: &Sample) -> String {
    format!("epoch {} step {} after {}", s.epoch, s.step, s.phase.name())
}

/// `b - a` as a signed number.
pub fn delta(a: u64, b: u64) -> i64 {
    b as i64 - a as i64
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

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_sim::timeline::{Source, TimelineMeta};

    fn t(device: bool) -> Timeline {
        let mut t = Timeline::new(Source::Simulated, TimelineMeta::default());
        for (step, phase, act) in [
            (0, Phase::Forward, 10u64),
            (0, Phase::Backward, 2),
            (1, Phase::Forward, 12),
        ] {
            let mut s = Sample {
                phase,
                step,
                epoch: 0,
                micro_batch: None,
                time_us: 0.0,
                host: Default::default(),
                device: Default::default(),
            };
            if device {
                s.device.categories.set(Category::Activation, act);
                s.device.categories.set(Category::Cache, 100);
            } else {
                s.host.categories.set(Category::Activation, act);
            }
            t.push(s);
        }
        t
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
    }
}
