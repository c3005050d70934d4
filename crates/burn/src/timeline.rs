//! Turning probe samples into the shared [`Timeline`] (source = measured).
//!
//! * `host.categories`: live bytes per category from the counting allocator (all zero, with
//!   the note `host_categories = unavailable`, when no counting allocator is installed);
//! * `host.handed_to_device`: the part of those bytes handed to a device backend for an upload
//!   and still held by it (trainmem-probe's mark, set where a batch is uploaded);
//! * `host.records`: the part of those bytes that is records beside the tensors (burn's graph,
//!   optimizer and module records, the loader's own memory), allocated outside the backend's
//!   ops;
//! * `host.device_reads`: tensor data read back from a device into host buffers outside Rust's
//!   allocator (cubecl's page-locked read buffers), counted by trainmem-track while the
//!   program holds it and added to `host.categories`, which the counting allocator alone
//!   would leave without them;
//! * `host.anon_rss` / `host.file_rss`: `RssAnon` and `RssFile + RssShmem` from `/proc`, and
//!   `host.data_file_rss`: the data set's own mappings' share of RssFile (`/proc/self/smaps`);
//! * `device`: on a cubecl device (CUDA, wgpu), cubecl's bytes in use (`allocated`) and
//!   reserved (`reserved`), with `cache = reserved - allocated`; the bytes per category are
//!   trainmem-track's count of the buffers (or, on a backend that attributes its own tensors,
//!   trainmem-meta, its own), through [`trainmem_track::DeviceFigures::categories`]. On a CPU
//!   backend tensors are host memory, so `device` is all zero and every tensor byte is in the
//!   host categories.

use trainmem_core::Category;
use trainmem_core::plan::Plan;
use trainmem_core::timeline::{
    CategoryBytes, DeviceBytes, HostBytes, Sample, Source, Timeline, TimelineMeta,
};

use crate::probe::ProbeSample;

/// One probe sample as a timeline sample.
pub fn to_sample(s: &ProbeSample) -> Sample {
    let mut host = HostBytes::default();
    if let Some(h) = s.host {
        host.categories = h;
    }
    host.device_reads = s.host_device_reads;
    for (category, bytes) in s.host_device_reads.iter() {
        host.categories.add(category, bytes);
    }
    if let Some(h) = s.host_handed_to_device {
        host.handed_to_device = h;
    }
    if let Some(r) = s.host_records {
        host.records = r;
    }
    host.data_file_rss = s.data_file_rss;
    if let Some(rss) = s.rss {
        host.anon_rss = rss.rss_anon;
        host.file_rss = rss.rss_file + rss.rss_shmem;
    }
    let mut device = DeviceBytes::default();
    if let Some(d) = s.device {
        device.allocated = d.bytes_in_use;
        device.reserved = d.bytes_reserved;
        device.peak_allocated = d.bytes_in_use;
        device.peak_reserved = d.bytes_reserved;
        if let Some(categories) = d.categories {
            device.categories = categories;
        }
        device.categories.set(
            Category::Cache,
            d.bytes_reserved.saturating_sub(d.bytes_in_use),
        );
    }
    Sample {
        phase: s.phase,
        step: s.step,
        epoch: s.epoch,
        micro_batch: s.micro_batch,
        time_us: s.time_us,
        host,
        device,
    }
}

/// The process's host memory now, as a timeline records it: live bytes per category when a
/// counting allocator is installed, RssAnon and RssFile (+ RssShmem) where `/proc` exists.
/// Read at a run's start, it is the run's baseline ([`TimelineMeta::baseline`]).
pub fn host_now() -> HostBytes {
    let mut host = HostBytes::default();
    if trainmem_probe::is_installed() {
        host.categories = CategoryBytes(trainmem_probe::snapshot().live.map(|v| v as u64));
    }
    if let Ok(rss) = trainmem_probe::rss::read() {
        host.anon_rss = rss.rss_anon;
        host.file_rss = rss.rss_file + rss.rss_shmem;
    }
    host
}

/// The measured timeline of a run of `plan`.
pub fn to_timeline(
    plan: &Plan,
    producer: &str,
    parameter_bytes: u64,
    samples: &[ProbeSample],
) -> Timeline {
    let mut meta = TimelineMeta {
        name: plan.name.clone(),
        producer: producer.to_string(),
        device: if samples.iter().any(|s| s.device.is_some()) {
            "cuda".to_string()
        } else {
            "cpu (tensors are host memory: see the host categories)".to_string()
        },
        ..Default::default()
    };
    if let Some(total) = samples
        .iter()
        .rev()
        .find_map(|s| s.device.and_then(|d| d.driver_total))
    {
        meta.device_capacity = Some(total);
    }
    let counted = samples.iter().any(|s| s.host.is_some());
    meta.notes.insert(
        "host_categories".into(),
        if counted {
            "counting allocator, tagged at allocation time".into()
        } else {
            "unavailable (no counting global allocator installed)".into()
        },
    );
    meta.notes
        .insert("parameter_bytes".into(), parameter_bytes.to_string());
    meta.notes.insert(
        "batch".into(),
        format!(
            "{} (micro-batch {}, accumulation {})",
            plan.training.batch_size,
            plan.micro_batch_size(),
            plan.accumulation_steps()
        ),
    );
    let mut t = Timeline::new(Source::Measured, meta);
    for s in samples {
        t.push(to_sample(s));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_core::timeline::Phase;
    use trainmem_probe::ProcStatus;
    use trainmem_track::DeviceFigures;

    #[test]
    fn samples_carry_host_categories_rss_and_device_cache() {
        let mut host = CategoryBytes::ZERO;
        host.set(Category::Parameter, 100);
        let s = ProbeSample {
            phase: Phase::Forward,
            step: 3,
            epoch: 1,
            micro_batch: Some(2),
            time_us: 5.0,
            host: Some(host),
            host_peak: Some(host),
            host_total_peak: Some(100),
            host_handed_to_device: Some({
                let mut h = CategoryBytes::ZERO;
                h.set(Category::Input, 60);
                h
            }),
            host_records: Some({
                let mut r = CategoryBytes::ZERO;
                r.set(Category::Parameter, 30);
                r
            }),
            host_device_reads: {
                let mut r = CategoryBytes::ZERO;
                r.set(Category::Temporary, 4096);
                r
            },
            data_file_rss: Some(12),
            rss: Some(ProcStatus {
                vm_rss: 70,
                rss_anon: 40,
                rss_file: 20,
                rss_shmem: 10,
                vm_hwm: 80,
                vm_peak: 90,
            }),
            device: Some(DeviceFigures {
                number_allocs: 2,
                bytes_in_use: 300,
                bytes_padding: 4,
                bytes_reserved: 1000,
                driver_free: Some(1),
                driver_total: Some(2),
                categories: None,
            }),
            trace_events: None,
            tracked: None,
        };
        let t = to_sample(&s);
        assert_eq!(t.host.categories.get(Category::Parameter), 100);
        assert_eq!((t.host.anon_rss, t.host.file_rss), (40, 30));
        assert_eq!(t.host.handed_to_device.get(Category::Input), 60);
        assert_eq!(t.host.records.get(Category::Parameter), 30);
        // data read back outside Rust's allocator is host memory the program holds
        assert_eq!(t.host.device_reads.get(Category::Temporary), 4096);
        assert_eq!(t.host.categories.get(Category::Temporary), 4096);
        assert_eq!((t.host.data_file_rss, t.host.data_rss()), (Some(12), 12));
        assert_eq!((t.device.allocated, t.device.reserved), (300, 1000));
        assert_eq!(t.device.categories.get(Category::Cache), 700);
        assert_eq!((t.step, t.epoch, t.micro_batch), (3, 1, Some(2)));
        let none = ProbeSample {
            host: None,
            device: None,
            rss: None,
            ..s
        };
        let t = to_sample(&none);
        assert_eq!(t.host.categories.total(), 4096, "the reads alone");
        assert_eq!(t.device.reserved, 0);
    }
}
