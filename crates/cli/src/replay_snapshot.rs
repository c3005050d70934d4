//! `trainmem replay SNAPSHOT.pickle`: a PyTorch memory snapshot replayed from the state its
//! recording began in (rebuilt from the final segments and the trace), under the run's own
//! `allocator_settings` unless `--allocator-conf` says otherwise; `--verify` compares the
//! replay with the recording as it goes; `--what-if` and `--capacity` add the side-by-side
//! table and the answer in words (`replay_what_if`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use trainmem_alloc::Snapshot;
use trainmem_alloc::pytorch::pickle::PickleError;
use trainmem_alloc::pytorch::replay::{
    RecordedFigures, Replayer, SnapshotReplay, SnapshotTraceInfo, Verification, ops_from_trace,
    prepare, recorded, verify,
};
use trainmem_alloc::{AllocatorConfig, format_size};

use crate::cmd_replay::{ReplayArgs, Sniffed};
use crate::replay_what_if::{self, WhatIf};

/// How the replay started.
enum Start {
    /// From the rebuilt start state.
    Rebuilt(Box<SnapshotReplay>),
    /// From an empty allocator, because the start state could not be rebuilt (the reason).
    Empty(Box<Empty>),
}

/// A replay from an empty allocator, the trace's figures and why the start state could not
/// be rebuilt.
type Empty = (
    Replayer<trainmem_alloc::SimulatedDevice>,
    SnapshotTraceInfo,
    String,
);

/// Everything the report needs.
struct Report {
    start: Start,
    verification: Option<Verification>,
    what_if: Option<WhatIf>,
    conf: String,
    /// Which device was replayed and why.
    device: DeviceChoice,
}

/// The device replayed, how it was chosen and the devices that recorded a trace.
struct DeviceChoice {
    /// The device replayed.
    device: usize,
    /// Named with `--device` (else the first device with a trace).
    asked: bool,
    /// The devices whose trace has entries.
    traced: Vec<usize>,
}

impl DeviceChoice {
    /// `--device N`, else the first device with a trace (device 0 when none has one), as
    /// `explain` picks.
    fn of(snapshot: &Snapshot, asked: Option<usize>) -> DeviceChoice {
        let traced: Vec<usize> = (snapshot.device_traces.iter().enumerate())
            .filter(|(_, t)| !t.is_empty())
            .map(|(d, _)| d)
            .collect();
        DeviceChoice {
            device: asked.unwrap_or_else(|| traced.first().copied().unwrap_or(0)),
            asked: asked.is_some(),
            traced,
        }
    }

    /// The line that says which device was replayed, when that is not plain: the snapshot
    /// has more than one device with a trace, the first with one is not device 0, or the
    /// device asked for recorded none.
    fn line(&self) -> Option<String> {
        let list = self
            .traced
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let d = self.device;
        if self.traced.is_empty() {
            None
        } else if !self.traced.contains(&d) {
            Some(format!(
                "note: device {d} recorded no trace; devices with a trace: {list} (--device N)"
            ))
        } else if !self.asked && (d != 0 || self.traced.len() > 1) {
            Some(format!(
                "device {d} is the first device with a trace (devices with a trace: {list}; \
                 --device N replays another)"
            ))
        } else if self.traced.len() > 1 {
            Some(format!(
                "device {d} of the devices with a trace: {list} (--device N replays another)"
            ))
        } else {
            None
        }
    }
}

impl Report {
    fn replayer(&self) -> &Replayer<trainmem_alloc::SimulatedDevice> {
        match &self.start {
            Start::Rebuilt(r) => &r.replayer,
            Start::Empty(e) => &e.0,
        }
    }

    fn info(&self) -> &SnapshotTraceInfo {
        match &self.start {
            Start::Rebuilt(r) => &r.info,
            Start::Empty(e) => &e.1,
        }
    }
}

/// Replays the snapshot in `bytes` (read from `path`, whose first bytes are `sniffed`) and
/// prints the report. Exit 1 when `--verify` finds a divergence, else 0.
pub fn run(
    args: &ReplayArgs,
    path: &Path,
    bytes: &[u8],
    sniffed: &Sniffed,
) -> anyhow::Result<ExitCode> {
    let p = path.display();
    let snapshot = match trainmem_alloc::pytorch::pickle::from_bytes(bytes) {
        Ok(s) => s,
        Err(err @ PickleError::NotAPickle { .. }) => {
            return Err(sniffed.not_a_pickle(path).unwrap_or_else(|| {
                anyhow::Error::new(err).context(format!("{p}: PyTorch snapshot"))
            }));
        }
        Err(err) => return Err(anyhow::Error::new(err).context(format!("{p}: PyTorch snapshot"))),
    };
    let config = match &args.allocator_conf {
        Some(text) => Some(
            AllocatorConfig::parse(text).with_context(|| format!("--allocator-conf `{text}`"))?,
        ),
        None => None,
    };
    let conf = match (&args.allocator_conf, &snapshot.allocator_settings) {
        (Some(text), _) => text.clone(),
        (None, Some(s)) if !s.conf.is_empty() => format!("the run's own ({})", s.conf),
        (None, Some(_)) => "the run's own (PyTorch defaults)".to_string(),
        (None, None) => "PyTorch defaults (the snapshot records no settings)".to_string(),
    };
    let device = DeviceChoice::of(&snapshot, args.device);
    let mut resolved = ReplayArgs {
        device: Some(device.device),
        ..args.clone()
    };
    if let (
        None,
        Ok(RecordedFigures {
            oom_capacity: Some(c),
            ..
        }),
    ) = (args.capacity, recorded(&snapshot, device.device))
    {
        resolved.capacity = Some(c);
    }
    let args = &resolved;
    let start =
        replay(&snapshot, args, config.clone()).with_context(|| format!("replaying {p}"))?;
    let (start, verification) = start;
    let what_if = match &start {
        Start::Rebuilt(r) => replay_what_if::evaluate(&snapshot, args, &r.recorded)
            .with_context(|| format!("what-if replays of {p}"))?,
        Start::Empty(..) => None,
    };
    let report = Report {
        start,
        verification,
        what_if,
        conf,
        device,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&report, args))?);
    } else {
        print!("{}", text(&report, args));
    }
    let diverged = (report.verification.as_ref()).is_some_and(|v| v.first_divergence.is_some());
    Ok(if diverged {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The replay itself: from the rebuilt start state (checked against the recording with
/// `--verify`), or from empty when the start cannot be rebuilt.
fn replay(
    snapshot: &Snapshot,
    args: &ReplayArgs,
    config: Option<AllocatorConfig>,
) -> anyhow::Result<(Start, Option<Verification>)> {
    match prepare(snapshot, args.device(), args.capacity(), config.clone()) {
        Ok(mut r) => {
            let v = if args.verify {
                Some(verify(&mut r, snapshot, args.device())?)
            } else {
                r.run()?;
                None
            };
            Ok((Start::Rebuilt(Box::new(r)), v))
        }
        Err(
            err @ (trainmem_alloc::pytorch::replay::ReplayError::StartState(_)
            | trainmem_alloc::pytorch::replay::ReplayError::Seed(_)),
        ) => {
            anyhow::ensure!(!args.verify, "--verify needs the start state: {err}");
            let (ops, info) = ops_from_trace(snapshot, args.device())?;
            let mut r = Replayer::simulated(args.capacity(), config.unwrap_or_default());
            r.apply_all(ops)?;
            Ok((Start::Empty(Box::new((r, info, err.to_string()))), None))
        }
        Err(err) => Err(err.into()),
    }
}

/// The `--json` object: the flattened statistics at the top level, the replay's figures
/// under `"replay"`.
fn json(report: &Report, args: &ReplayArgs) -> serde_json::Value {
    let replayer = report.replayer();
    let mut top = serde_json::Map::new();
    for (key, value) in replayer.allocator().memory_stats() {
        top.insert(key, serde_json::Value::from(value));
    }
    let info = report.info();
    let mut r = serde_json::json!({
        "trace": args.trace.display().to_string(),
        "format": "pytorch_snapshot",
        "capacity": args.capacity(),
        "allocator_conf": report.conf,
        "counts": replayer.counts(),
        "ooms": replayer.ooms(),
        "snapshot": crate::cmd_replay::snapshot_info_json(args.device(), info),
    });
    if let Some(snapshot) = r.get_mut("snapshot").and_then(|v| v.as_object_mut()) {
        snapshot.insert(
            "devices_with_traces".into(),
            serde_json::json!(report.device.traced),
        );
    }
    if let Some(obj) = r.as_object_mut() {
        match &report.start {
            Start::Rebuilt(s) => {
                obj.insert(
                    "start_state".into(),
                    serde_json::json!({
                        "rebuilt": true,
                        "segments": s.recorded.start_segments,
                        "reserved": s.recorded.start_reserved,
                        "allocated": s.recorded.start_allocated,
                        "live_blocks": s.start.live.len(),
                    }),
                );
                obj.insert("recorded".into(), serde_json::json!(s.recorded));
            }
            Start::Empty(e) => {
                let why = &e.2;
                obj.insert(
                    "start_state".into(),
                    serde_json::json!({ "rebuilt": false, "reason": why }),
                );
            }
        }
        if let Some(v) = &report.verification {
            obj.insert("verify".into(), serde_json::json!(v));
        }
        if let Some(w) = &report.what_if {
            obj.insert("what_if".into(), serde_json::json!(w.outcomes));
            obj.insert("answer".into(), serde_json::json!(w.answer));
        }
    }
    top.insert("replay".into(), r);
    serde_json::Value::Object(top)
}

/// The text report.
fn text(report: &Report, args: &ReplayArgs) -> String {
    use std::fmt::Write as _;
    let replayer = report.replayer();
    let a = replayer.allocator();
    let c = replayer.counts();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replayed {} (PyTorch snapshot, device {}) on a simulated device of {}, allocator config: {}",
        args.trace.display(),
        args.device(),
        format_size(args.capacity()),
        report.conf
    );
    if let Some(line) = report.device.line() {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "ops: {}  allocs: {}  frees: {}  cache releases: {}  live at end: {}  OOMs: {}",
        c.ops,
        c.allocs,
        c.frees,
        c.empty_cache_calls,
        c.live_at_end,
        replayer.ooms().len()
    );
    match &report.start {
        Start::Rebuilt(s) => {
            let r = &s.recorded;
            let _ = writeln!(
                out,
                "start of recording (rebuilt): {} segments, {} reserved, {} allocated in {} live blocks",
                r.start_segments,
                format_size(r.start_reserved),
                format_size(r.start_allocated),
                s.start.live.len()
            );
            let _ = writeln!(
                out,
                "peak reserved: recorded {} B, replayed {} B; cudaMalloc calls: recorded {}, replayed {}; cudaFree calls: recorded {}, replayed {}",
                r.peak_reserved,
                a.max_memory_reserved(),
                r.segment_allocs,
                a.stats().num_device_alloc,
                r.segment_frees,
                a.stats().num_device_free
            );
        }
        Start::Empty(e) => {
            let (info, why) = (&e.1, &e.2);
            let _ = writeln!(
                out,
                "start of recording could not be rebuilt ({why}); replayed from an empty allocator, \
                 skipping {} frees of blocks allocated before the trace began",
                info.frees_of_unknown_blocks
            );
        }
    }
    if let Some(v) = &report.verification {
        out.push_str(&verify_text(v));
    }
    out.push('\n');
    out.push_str(&a.memory_summary());
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if let Some(w) = &report.what_if {
        out.push('\n');
        out.push_str(&replay_what_if::table(&w.outcomes, args.capacity()));
        for line in &w.answer {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// The `--verify` lines.
fn verify_text(v: &Verification) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let rows = [
        ("segment_alloc (cudaMalloc)", v.segment_allocs),
        ("segment_free (cudaFree)", v.segment_frees),
        ("alloc at the recorded address", v.allocs),
        ("oom (out of memory here too)", v.ooms),
        ("final segments", v.end_segments),
        ("final blocks", v.end_blocks),
    ];
    let _ = writeln!(out, "verify against the recording:");
    for (name, a) in rows {
        let _ = writeln!(out, "  {name}: {} of {} agree", a.agreed, a.recorded);
    }
    match &v.first_divergence {
        None => {
            let _ = writeln!(out, "  no divergence");
        }
        Some(d) => {
            let at = d
                .entry
                .map_or("the end state".to_string(), |e| format!("entry {e}"));
            let _ = writeln!(out, "  first divergence at {at}: {}", d.request);
            let _ = writeln!(out, "    PyTorch:  {}", d.pytorch);
            let _ = writeln!(out, "    trainmem: {}", d.trainmem);
        }
    }
    out
}
