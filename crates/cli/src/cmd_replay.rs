//! `trainmem replay TRACE [--allocator-conf STR] [--capacity BYTES] [--device N] [--json]
//! [--verify] [--what-if CONF]...`:
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
//! (`stream` is optional, default 0; an alloc may name its block with `"label":"activation"`;
//! blank lines and lines starting with `#` are skipped), or a PyTorch memory snapshot pickle
//! (`torch.cuda.memory._dump_snapshot`), recognised by its name (`.pickle`, `.pkl`) or its
//! first bytes ([`Sniffed`]), replayed from the state its recording began in with `--verify`
//! and `--what-if` (`replay_snapshot`).
//!
//! Reading and replaying is trainmem-alloc's (`trainmem_alloc::pytorch::replay`); this module
//! parses the arguments and prints the report.

use std::fs::File;
use std::io::{BufReader, IsTerminal, Read};
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use trainmem_alloc::pytorch::pickle::PICKLE_MAGIC;
use trainmem_alloc::pytorch::replay::{Progress, ReplayError, Replayer, TraceFormat, replay_trace};
use trainmem_alloc::{AllocatorConfig, SimulatedDevice, format_size};

/// The replay: trainmem-alloc's engine on a simulated device.
type Replay = Replayer<SimulatedDevice>;

/// Arguments of `trainmem replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The trace: JSON lines ({"op":"alloc","id":7,"size":3145728,"stream":0}, {"op":"free","id":7},
    /// {"op":"empty_cache"}) or a PyTorch memory snapshot pickle (named *.pickle or *.pkl, or
    /// recognised by its first bytes).
    pub(crate) trace: PathBuf,
    /// Allocator configuration in PYTORCH_ALLOC_CONF syntax, e.g.
    /// "max_split_size_mb:128,roundup_power2_divisions:4". Default: PyTorch's defaults for
    /// JSON lines; a snapshot's own `allocator_settings`.
    #[arg(long, value_name = "STR")]
    pub(crate) allocator_conf: Option<String>,
    /// Simulated device capacity: bytes or a size such as 24GiB, 512MiB, 80GB. Default 80GiB;
    /// for a snapshot that ran out of memory, the capacity it ran out on (reserved plus what
    /// CUDA reported free at its first `oom`).
    #[arg(long, value_name = "BYTES", value_parser = parse_capacity)]
    pub(crate) capacity: Option<u64>,
    /// For snapshot pickles: which device's trace to replay (default: the first with a
    /// trace).
    #[arg(long, value_name = "N")]
    pub(crate) device: Option<usize>,
    /// Print one JSON object: PyTorch's flattened memory_stats keys, plus the replay's own
    /// figures under "replay".
    #[arg(long)]
    pub(crate) json: bool,
    /// For snapshot pickles: compare the replay with the recording as it goes (every
    /// cudaMalloc/cudaFree, every block's address, the end state) and report the first
    /// divergence; exit 1 when there is one.
    #[arg(long)]
    pub(crate) verify: bool,
    /// For snapshot pickles: also replay under this configuration (PYTORCH_ALLOC_CONF syntax,
    /// plus `per_process_memory_fraction:F` and `empty_cache_at_snapshots:True`) and show it
    /// beside the recorded run. Repeatable.
    #[arg(long = "what-if", value_name = "CONF")]
    pub(crate) what_if: Vec<String>,
}

/// The capacity when `--capacity` is not given (and a snapshot recorded no out-of-memory).
pub(crate) const DEFAULT_CAPACITY: u64 = 80 << 30;

/// `replay --help`'s exit statuses.
pub(crate) const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  replayed, also when allocations ran out of memory on the simulated device (the report
     counts them: \"OOMs: N\")
  1  an error (unreadable or malformed trace, bad option), or --verify found a divergence
     from the recording
  2  the command line itself is wrong (an unknown option, a missing or invalid value)";

impl ReplayArgs {
    /// The simulated device's capacity.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.unwrap_or(DEFAULT_CAPACITY)
    }

    /// The snapshot device replayed (`replay_snapshot` resolves the default before using it).
    pub(crate) fn device(&self) -> usize {
        self.device.unwrap_or(0)
    }
}

/// Bytes [`Sniffed::of`] looks at.
const HEAD_BYTES: usize = 16;

/// What a file's first bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Content {
    /// No bytes at all.
    Empty,
    /// A pickle of this protocol: 2 or later from its PROTO opcode (first byte 0x80); 0 or 1,
    /// which have no PROTO opcode, from their first opcodes (`(d`/`(l`, a MARK then a text
    /// DICT or LIST, for 0; `}`/`]`, an EMPTY_DICT or EMPTY_LIST then a memo or MARK, for 1).
    Pickle(u8),
    /// Anything else (TOML, JSON lines, text, other binary data).
    Other,
}

/// What a file given to `replay` or `explain` is, by its name and its first bytes.
#[derive(Debug, Clone)]
pub(crate) struct Sniffed {
    /// Its first bytes (up to [`HEAD_BYTES`]).
    pub(crate) head: Vec<u8>,
    /// What they are.
    pub(crate) content: Content,
    /// Named `*.pickle` or `*.pkl`.
    pub(crate) named_pickle: bool,
}

impl Sniffed {
    /// Reads the first bytes of `path`.
    pub(crate) fn of(path: &Path) -> anyhow::Result<Sniffed> {
        let mut head = Vec::with_capacity(HEAD_BYTES);
        File::open(path)
            .and_then(|f| f.take(HEAD_BYTES as u64).read_to_end(&mut head))
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(Sniffed::of_bytes(path, &head))
    }

    /// What `bytes`, read from `path`, are.
    pub(crate) fn of_bytes(path: &Path, bytes: &[u8]) -> Sniffed {
        let head = &bytes[..bytes.len().min(HEAD_BYTES)];
        let named_pickle = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("pickle") || e.eq_ignore_ascii_case("pkl"));
        Sniffed {
            content: content_of(head),
            head: head.to_vec(),
            named_pickle,
        }
    }

    /// Read as a snapshot: a pickle by its bytes, or anything named like one.
    pub(crate) fn is_snapshot(&self) -> bool {
        self.named_pickle || matches!(self.content, Content::Pickle(_))
    }

    /// Why a file read as a snapshot cannot be one before any reader sees it: it is empty.
    pub(crate) fn ensure_not_empty(&self, path: &Path) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.content != Content::Empty,
            "{} is empty (0 bytes), not a PyTorch memory snapshot pickle",
            path.display()
        );
        Ok(())
    }

    /// The error for a file named like a pickle whose reader failed and that does not start
    /// like one: not a pickle (`None` when it starts like a pickle: the reader's error says
    /// what is wrong with it).
    pub(crate) fn not_a_pickle(&self, path: &Path) -> Option<anyhow::Error> {
        (self.content == Content::Other).then(|| {
            anyhow::anyhow!(
                "{} is not a pickle: it starts with {:?}; a PyTorch memory snapshot \
                 (torch.cuda.memory._dump_snapshot) is a pickle, which starts with byte 0x80",
                path.display(),
                String::from_utf8_lossy(&self.head)
            )
        })
    }
}

/// What `head` (a file's first bytes) is.
fn content_of(head: &[u8]) -> Content {
    match head {
        [] => Content::Empty,
        [PICKLE_MAGIC] => Content::Pickle(2),
        [PICKLE_MAGIC, protocol, ..] => Content::Pickle((*protocol).max(2)),
        [b'(', b'd' | b'l', ..] => Content::Pickle(0),
        [b'}' | b']'] | [b'}' | b']', b'q' | b'r' | b'(' | b'.', ..] => Content::Pickle(1),
        _ => Content::Other,
    }
}

fn parse_capacity(text: &str) -> Result<u64, String> {
    match trainmem_core::bytes::parse_bytes(text) {
        Ok(0) => Err("the capacity must be more than 0 bytes".to_string()),
        other => other,
    }
}

/// Traces at least this big get a progress bar (when stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 8 << 20;
/// Ops between progress bar updates.
const PROGRESS_EVERY: u64 = 1 << 14;

/// Runs `trainmem replay`.
pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    // every --what-if is checked before any replay starts
    for text in &args.what_if {
        crate::replay_what_if::parse_scenario(text)?;
    }
    let sniffed = Sniffed::of(&args.trace)?;
    if sniffed.is_snapshot() {
        sniffed.ensure_not_empty(&args.trace)?;
        let bytes = std::fs::read(&args.trace)
            .with_context(|| format!("reading {}", args.trace.display()))?;
        return crate::replay_snapshot::run(&args, &args.trace, &bytes, &sniffed);
    }
    anyhow::ensure!(
        !args.verify && args.what_if.is_empty(),
        "--verify and --what-if need a PyTorch snapshot pickle; {} is JSON lines",
        args.trace.display()
    );
    anyhow::ensure!(
        args.device.is_none(),
        "--device applies to PyTorch snapshot pickles; {} is JSON lines",
        args.trace.display()
    );
    let conf = args.allocator_conf.clone().unwrap_or_default();
    let config =
        AllocatorConfig::parse(&conf).with_context(|| format!("--allocator-conf `{conf}`"))?;
    let (replay, format) = replay_file(&args.trace, args.capacity(), config, args.device())?;
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

/// Replays the file at `path` (JSON lines, or a snapshot pickle by its first byte) with a
/// progress bar.
fn replay_file(
    path: &Path,
    capacity: u64,
    config: AllocatorConfig,
    device: usize,
) -> anyhow::Result<(Replay, TraceFormat)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let reader = BufReader::with_capacity(1 << 16, file);
    let mut replay = Replayer::simulated(capacity, config);
    let mut bar: Option<ProgressBar> = None;
    let result = replay_trace(reader, &mut replay, device, |p: Progress| {
        if !p.ops.is_multiple_of(PROGRESS_EVERY) {
            return;
        }
        let bar = bar.get_or_insert_with(|| match p.total_ops {
            Some(total) => progress_bar(total, len, false),
            None => progress_bar(len, len, true),
        });
        bar.set_position(if p.total_ops.is_some() {
            p.ops
        } else {
            p.bytes_read
        });
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let format = result.map_err(|err| in_file(err, path))?;
    Ok((replay, format))
}

/// Says which file (and, for snapshots, which format) an error is about.
fn in_file(err: ReplayError, path: &Path) -> anyhow::Error {
    let p = path.display();
    match err {
        ReplayError::Io(io) => anyhow::Error::new(io).context(format!("reading {p}")),
        ReplayError::Pickle(_)
        | ReplayError::NoSuchDevice { .. }
        | ReplayError::AddressAlreadyLive { .. } => {
            anyhow::Error::new(err).context(format!("{p}: PyTorch snapshot"))
        }
        // the message quotes the JSON parser's: its source would say it again
        ReplayError::Malformed { .. } => anyhow::anyhow!("{p}: {err}"),
        ReplayError::ReadLine { .. } => anyhow::Error::new(err).context(format!("{p}")),
        _ => anyhow::Error::new(err).context(format!("replaying {p}")),
    }
}

/// What a snapshot's trace held, for the `--json` report's `"snapshot"` key.
pub(crate) fn snapshot_info_json(
    device: usize,
    info: &trainmem_alloc::pytorch::replay::SnapshotTraceInfo,
) -> serde_json::Value {
    serde_json::json!({
        "device": device,
        "devices": info.devices,
        "entries": info.entries,
        "free_action": info.free_action,
        "frees_of_unknown_blocks": info.frees_of_unknown_blocks,
        "recorded_ooms": info.recorded_ooms,
        "segment_entries": info.segment_entries,
    })
}

/// The `--json` object: the flattened stats at the top level, the replay's figures under
/// `"replay"`.
fn json_report(replay: &Replay, format: &TraceFormat, args: &ReplayArgs) -> serde_json::Value {
    let mut top = serde_json::Map::new();
    for (key, value) in replay.allocator().memory_stats() {
        top.insert(key, serde_json::Value::from(value));
    }
    let mut r = serde_json::json!({
        "trace": args.trace.display().to_string(),
        "format": match format { TraceFormat::JsonLines => "jsonl", TraceFormat::Snapshot(_) => "pytorch_snapshot" },
        "capacity": args.capacity(),
        "allocator_conf": args.allocator_conf.clone().unwrap_or_default(),
        "counts": replay.counts(),
        "ooms": replay.ooms(),
    });
    if let (TraceFormat::Snapshot(info), Some(obj)) = (format, r.as_object_mut()) {
        obj.insert("snapshot".into(), snapshot_info_json(args.device(), info));
    }
    top.insert("replay".into(), r);
    serde_json::Value::Object(top)
}

/// OOMs listed in full in the text report; the rest are counted.
const OOMS_SHOWN: usize = 20;

fn text_report(replay: &Replay, format: &TraceFormat, args: &ReplayArgs) -> String {
    use std::fmt::Write as _;
    let c = replay.counts();
    let mut out = String::new();
    let conf = match args.allocator_conf.as_deref() {
        None | Some("") => "default",
        Some(text) => text,
    };
    let _ = writeln!(
        out,
        "replayed {} ({}) on a simulated device of {}, allocator config: {conf}",
        args.trace.display(),
        match format {
            TraceFormat::JsonLines => "JSON lines".to_string(),
            TraceFormat::Snapshot(_) => format!("PyTorch snapshot, device {}", args.device()),
        },
        format_size(args.capacity())
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
    if let TraceFormat::Snapshot(info) = format {
        let _ = writeln!(
            out,
            "snapshot: {} device trace(s); {} entries on device {}; frees taken from `{}`; {} frees of \
             blocks allocated before the trace began (skipped); {} OOMs recorded by PyTorch",
            info.devices,
            info.entries,
            args.device(),
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
