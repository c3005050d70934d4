//! `trainmem explain SNAPSHOT.pickle`: what filled the GPU in a PyTorch memory snapshot, by
//! category and by source line, and what would have saved it (trainmem-sim's
//! `snapshot_explain`). `--out DIR` writes `report.txt`, `report.json`, the timeline of bytes
//! per category at each phase with the exports `simulate --out` writes (`timeline.json`,
//! `trace.json`, `timeline.svg`), and the snapshot back with every trace event's category
//! set (`snapshot.annotated.pickle`), which PyTorch's viewer colours by category.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_sim::snapshot_explain::{ExplainOptions, annotate, explain_snapshot, render};

use trainmem_core::export::files;

use crate::cmd_sim::{ExplainArgs, write_timeline_exports};

/// The annotated snapshot's file name under `--out`.
pub const ANNOTATED_PICKLE: &str = "snapshot.annotated.pickle";

/// Explains the snapshot in `bytes` (read from `path`).
pub fn run(args: &ExplainArgs, path: &Path, bytes: &[u8]) -> anyhow::Result<ExitCode> {
    let p = path.display();
    let f = FramedSnapshot::read(bytes).with_context(|| format!("{p}: PyTorch memory snapshot"))?;
    let opts = ExplainOptions {
        device: args.device,
        capacity: args.capacity,
        top_sites: args.top,
        replay_remedies: true,
    };
    let ex = explain_snapshot(&f, &opts).with_context(|| format!("{p}"))?;
    let text = render::render_text(&p.to_string(), &ex);
    let json = serde_json::to_string_pretty(&ex)?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, data: &[u8]| -> anyhow::Result<()> {
            let to = dir.join(name);
            std::fs::write(&to, data).with_context(|| format!("writing {}", to.display()))
        };
        write(files::REPORT_TXT, text.as_bytes())?;
        write(files::REPORT_JSON, json.as_bytes())?;
        write_timeline_exports(&write, &ex.timeline)?;
        let annotated = annotate(&f, bytes, &ex)?;
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
