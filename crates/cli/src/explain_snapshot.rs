//! `trainmem explain SNAPSHOT.pickle`: what filled the GPU in a PyTorch memory snapshot, by
//! category and by source line, and what would have saved it (trainmem-sim's
//! `snapshot_explain`). `--out DIR` writes `report.txt`, `report.json`, the timeline of bytes
//! per category at each phase with the exports `simulate --out` writes (`timeline.json`,
//! `trace.json`, `timeline.svg`), and the snapshot back with every trace event's category
//! set (`snapshot.annotated.pickle`), which PyTorch's viewer colours by category.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use trainmem_alloc::pytorch::framed::{FramedError, FramedSnapshot};
use trainmem_sim::snapshot_explain::{ExplainOptions, annotate, explain_snapshot, render};

use trainmem_core::export::files;

use crate::cmd_replay::{Content, Sniffed};
use crate::cmd_sim::{ExplainArgs, write_timeline_exports};

/// The annotated snapshot's file name under `--out`.
pub const ANNOTATED_PICKLE: &str = "snapshot.annotated.pickle";

/// `explain --help`'s account of what is read as a snapshot, and the exit statuses.
pub(crate) const EXPLAIN_HELP: &str = "\
A file named *.pickle or *.pkl, or whose first bytes are a pickle's, is read as a PyTorch
memory snapshot; anything else as a plan (TOML).

Exit status:
  0  explained; the plan or the recorded run fits
  1  an error (unreadable, empty or malformed file, bad option)
  2  out of memory: a plan that does not fit its device (or --capacity); a snapshot whose
     run ran out of memory, or whose recorded peak exceeds --capacity with no remedy that
     fits. Also the status of a wrong command line (unknown option, invalid value)";

/// Runs `trainmem explain`: a snapshot (named `*.pickle`/`*.pkl`, or starting like a pickle)
/// is explained as a recorded run here; anything else is a plan (`cmd_sim::explain_plan`).
pub fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let path = args.plan.clone();
    let sniffed = Sniffed::of(&path)?;
    if sniffed.is_snapshot() {
        sniffed.ensure_not_empty(&path)?;
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        return run_sniffed(&args, &path, &bytes, &sniffed);
    }
    anyhow::ensure!(
        sniffed.content != Content::Empty,
        "{} is empty (0 bytes): expected a plan (TOML) or a PyTorch memory snapshot pickle",
        path.display()
    );
    crate::cmd_sim::explain_plan(args)
}

/// Reads the snapshot in `bytes`, saying what is wrong in the words of the way it was taken
/// for one (`sniffed`): not a pickle at all, or a protocol-0 pickle explain cannot read.
fn read(path: &Path, bytes: &[u8], sniffed: &Sniffed) -> anyhow::Result<FramedSnapshot> {
    let p = path.display();
    match FramedSnapshot::read(bytes) {
        Ok(f) => Ok(f),
        Err(err @ FramedError::Pickle(_)) => match (sniffed.content, sniffed.not_a_pickle(path)) {
            (_, Some(not_a_pickle)) => Err(not_a_pickle),
            (Content::Pickle(0), _) => Err(anyhow::anyhow!(
                "{p}: pickle protocol 0 (text) is not supported by explain ({err}); PyTorch \
                 writes protocol 2 or later: re-dump it with \
                 torch.cuda.memory._dump_snapshot (`trainmem replay` reads it as it is)"
            )),
            _ => Err(anyhow::Error::new(err).context(format!("{p}: PyTorch memory snapshot"))),
        },
        Err(err) => Err(anyhow::Error::new(err).context(format!("{p}: PyTorch memory snapshot"))),
    }
}

/// The line that says which devices recorded a trace, when more than the one explained did
/// (`None` otherwise).
fn devices_line(f: &FramedSnapshot, device: usize) -> Option<String> {
    let traced: Vec<String> = (f.snapshot.device_traces.iter().enumerate())
        .filter(|(_, t)| !t.is_empty())
        .map(|(d, _)| d.to_string())
        .collect();
    (traced.len() > 1).then(|| {
        format!(
            "device {device} of the {} devices with a trace ({}); --device N explains another",
            traced.len(),
            traced.join(", ")
        )
    })
}

/// `render`'s text with [`devices_line`] after its first line.
fn with_devices_line(text: String, line: Option<String>) -> String {
    let Some(line) = line else {
        return text;
    };
    match text.split_once('\n') {
        Some((first, rest)) => format!("{first}\n{line}\n{rest}"),
        None => format!("{text}\n{line}\n"),
    }
}

/// Explains the snapshot in `bytes` (read from `path`, whose first bytes are `sniffed`).
fn run_sniffed(
    args: &ExplainArgs,
    path: &Path,
    bytes: &[u8],
    sniffed: &Sniffed,
) -> anyhow::Result<ExitCode> {
    let p = path.display();
    let f = read(path, bytes, sniffed)?;
    let opts = ExplainOptions {
        device: args.device,
        capacity: args.capacity,
        top_sites: args.top,
        replay_remedies: true,
    };
    let ex = explain_snapshot(&f, &opts).with_context(|| format!("{p}"))?;
    let text = with_devices_line(
        render::render_text(&p.to_string(), &ex),
        devices_line(&f, ex.device),
    );
    let json = serde_json::to_string_pretty(&ex)?;
    if let Some(dir) = &args.out {
        // everything that can fail but writing is done before anything is written
        let annotated = annotate(&f, bytes, &ex)?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, data: &[u8]| -> anyhow::Result<()> {
            let to = dir.join(name);
            std::fs::write(&to, data).with_context(|| format!("writing {}", to.display()))
        };
        write(files::REPORT_TXT, text.as_bytes())?;
        write(files::REPORT_JSON, json.as_bytes())?;
        write_timeline_exports(&write, &ex.timeline)?;
        write(ANNOTATED_PICKLE, &annotated)?;
        if !args.json {
            eprintln!(
                "wrote {}/{{report.txt, report.json, timeline.json, trace.json, timeline.svg, \
                 {ANNOTATED_PICKLE}}}",
                dir.display()
            );
        }
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{text}");
    }
    // out of memory (recorded, or on --capacity with no remedy that fits): exit code 2
    let fits = ex.capacity.is_none_or(|c| {
        ex.allocator.is_none_or(|a| a.peak_reserved <= c)
            || ex.remedies.iter().any(|r| r.fits == Some(true))
    });
    Ok(if ex.oom.is_some() || !fits {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
