//! `trainmem replay TRACE [--allocator-conf STR] [--capacity BYTES] [--device N] [--json]`:
//! replays an allocation trace through trainmem's caching allocator on a simulated device and
//! prints its statistics.
//!
//! TRACE is either JSON lines, one op per line:
//!
//! ```text
//! {"op":"alloc","id":7,"size":3145728,"stream":0}
//! {"op":"free","id":7}
//! {"op":"empty_cache"}
//! ```
//!
//! (`stream` is optional, default 0; blank lines and lines starting with `#` are skipped), or a
//! PyTorch memory snapshot pickle (`torch.cuda.memory._dump_snapshot`), recognised by its first
//! byte 0x80, whose `device_traces` are replayed by address.

use std::fs::File;
use std::io::{BufReader, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use trainmem_alloc::{AllocatorConfig, format_size};

#[path = "replay/engine.rs"]
mod engine;
#[path = "replay/trace.rs"]
mod trace;

use engine::Replay;
use trace::{JsonLines, PICKLE_MAGIC, SnapshotInfo};

/// Arguments of `trainmem replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The trace: JSON lines ({"op":"alloc","id":7,"size":3145728,"stream":0}, {"op":"free","id":7},
    /// {"op":"empty_cache"}) or a PyTorch memory snapshot pickle.
    trace: PathBuf,
    /// Allocator configuration in PYTORCH_ALLOC_CONF syntax, e.g.
    /// "max_split_size_mb:128,roundup_power2_divisions:4".
    #[arg(long, value_name = "STR", default_value = "")]
    allocator_conf: String,
    /// Simulated device capacity: bytes or a size such as 24GiB, 512MiB, 80GB.
    #[arg(long, value_name = "BYTES", default_value = "80GiB", value_parser = parse_capacity)]
    capacity: u64,
    /// For snapshot pickles: which device's trace to replay.
    #[arg(long, value_name = "N", default_value_t = 0)]
    device: usize,
    /// Print one JSON object: PyTorch's flattened memory_stats keys, plus the replay's own
    /// figures under "replay".
    #[arg(long)]
    json: bool,
}

fn parse_capacity(text: &str) -> Result<u64, String> {
    match trainmem_sim::bytes::parse_bytes(text) {
        Ok(0) => Err("the capacity must be more than 0 bytes".to_string()),
        other => other,
    }
}

/// Traces at least this big get a progress bar (when stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 8 << 20;
/// Ops between progress bar updates.
const PROGRESS_EVERY: u64 = 1 << 14;

/// Which format the trace had.
enum Format {
    JsonLines,
    Snapshot(SnapshotInfo),
}

/// Runs `trainmem replay`.
pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let config = AllocatorConfig::parse(&args.allocator_conf)
        .with_context(|| format!("--allocator-conf `{}`", args.allocator_conf))?;
    let (replay, format) = replay_file(&args.trace, args.capacity, config, args.device)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json_report(&replay, &format, &args))?
        );
    } else {
        print!("{}", text_report(&replay, &format, &args));
    }
    Ok(ExitCode::SUCCESS)
}

/// A progress bar over `total` (bytes or ops), shown only when stderr is a terminal and the
/// trace file is at least [`PROGRESS_MIN_BYTES`] long.
fn progress_bar(total: u64, trace_bytes: u64, unit_is_bytes: bool) -> ProgressBar {
    if trace_bytes < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let template = if unit_is_bytes {
        "replaying {bar:40} {bytes}/{total_bytes} ({eta})"
    } else {
        "replaying {bar:40} {pos}/{len} ops ({eta})"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// Replays the file at `path`.
fn replay_file(
    path: &Path,
    capacity: u64,
    config: AllocatorConfig,
    device: usize,
) -> anyhow::Result<(Replay, Format)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut replay = Replay::new(capacity, config);

    let mut first = [0u8; 1];
    let is_pickle = {
        use std::io::BufRead;
        let buf = reader
            .fill_buf()
            .with_context(|| format!("reading {}", path.display()))?;
        if let Some(&b) = buf.first() {
            first[0] = b;
        }
        !buf.is_empty() && first[0] == PICKLE_MAGIC
    };

    if is_pickle {
        let mut bytes = Vec::with_capacity(len as usize);
        reader
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", path.display()))?;
        let (ops, info) = trace::ops_from_snapshot(&bytes, device)
            .with_context(|| format!("{}: PyTorch snapshot", path.display()))?;
        drop(bytes);
        let bar = progress_bar(ops.len() as u64, len, false);
        for (n, (origin, op)) in ops.into_iter().enumerate() {
            replay
                .apply(origin, op)
                .with_context(|| format!("replaying {}", path.display()))?;
            if (n as u64).is_multiple_of(PROGRESS_EVERY) {
                bar.set_position(n as u64);
            }
        }
        bar.finish_and_clear();
        return Ok((replay, Format::Snapshot(info)));
    }

    let bar = progress_bar(len, len, true);
    let mut lines = JsonLines::new(reader);
    let mut n = 0u64;
    while let Some(item) = lines.next() {
        let (origin, op) = item.with_context(|| format!("{}", path.display()))?;
        replay
            .apply(origin, op)
            .with_context(|| format!("replaying {}", path.display()))?;
        n += 1;
        if n.is_multiple_of(PROGRESS_EVERY) {
            bar.set_position(lines.bytes_read());
        }
    }
    bar.finish_and_clear();
    Ok((replay, Format::JsonLines))
}

/// The `--json` object: the flattened stats at the top level, the replay's figures under
/// `"replay"`.
fn json_report(replay: &Replay, format: &Format, args: &ReplayArgs) -> serde_json::Value {
    let mut top = serde_json::Map::new();
    for (key, value) in replay.allocator().memory_stats() {
        top.insert(key, serde_json::Value::from(value));
    }
    let mut r = serde_json::json!({
        "trace": args.trace.display().to_string(),
        "format": match format { Format::JsonLines => "jsonl", Format::Snapshot(_) => "pytorch_snapshot" },
        "capacity": args.capacity,
        "allocator_conf": args.allocator_conf,
        "counts": replay.counts(),
        "ooms": replay.ooms(),
    });
    if let (Format::Snapshot(info), Some(obj)) = (format, r.as_object_mut()) {
        obj.insert(
            "snapshot".into(),
            serde_json::json!({
                "device": args.device,
                "devices": info.devices,
                "entries": info.entries,
                "free_action": info.free_action,
                "frees_of_unknown_blocks": info.frees_of_unknown_blocks,
                "recorded_ooms": info.recorded_ooms,
                "segment_entries": info.segment_entries,
            }),
        );
    }
    top.insert("replay".into(), r);
    serde_json::Value::Object(top)
}

/// OOMs listed in full in the text report; the rest are counted.
const OOMS_SHOWN: usize = 20;

fn text_report(replay: &Replay, format: &Format, args: &ReplayArgs) -> String {
    use std::fmt::Write as _;
    let c = replay.counts();
    let mut out = String::new();
    let conf = if args.allocator_conf.is_empty() {
        "default"
    } else {
        args.allocator_conf.as_str()
    };
    let _ = writeln!(
        out,
        "replayed {} ({}) on a simulated device of {}, allocator config: {conf}",
        args.trace.display(),
        match format {
            Format::JsonLines => "JSON lines".to_string(),
            Format::Snapshot(_) => format!("PyTorch snapshot, device {}", args.device),
        },
        format_size(args.capacity)
    );
    let _ = writeln!(
        out,
        "ops: {}  allocs: {}  frees: {}  empty_cache: {} (released {})  live at end: {}",
        c.ops,
        c.allocs,
        c.frees,
        c.empty_cache_calls,
        format_size(c.empty_cache_released_bytes),
        c.live_at_end
    );
    if let Format::Snapshot(info) = format {
        let _ = writeln!(
            out,
            "snapshot: {} device trace(s); {} entries on device {}; frees taken from `{}`; {} frees of \
             blocks allocated before the trace began (skipped); {} OOMs recorded by PyTorch",
            info.devices,
            info.entries,
            args.device,
            info.free_action,
            info.frees_of_unknown_blocks,
            info.recorded_ooms
        );
    }
    let ooms = replay.ooms();
    let _ = writeln!(out, "OOMs: {}", ooms.len());
    for o in ooms.iter().take(OOMS_SHOWN) {
        let _ = writeln!(
            out,
            "  {}: alloc id {} of {} bytes: {}",
            o.at, o.id, o.size, o.message
        );
    }
    if ooms.len() > OOMS_SHOWN {
        let _ = writeln!(
            out,
            "  ... and {} more (see --json)",
            ooms.len() - OOMS_SHOWN
        );
    }
    if c.frees_of_failed_allocs > 0 {
        let _ = writeln!(
            out,
            "frees of blocks whose alloc ran out of memory (skipped): {}",
            c.frees_of_failed_allocs
        );
    }
    out.push('\n');
    out.push_str(&replay.allocator().memory_summary());
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}
