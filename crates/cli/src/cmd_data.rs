//! `trainmem data`: inspect data-set files (memory-mapped `.npy` and raw record files).

use std::path::PathBuf;
use std::process::ExitCode;

use trainmem_loader::MappedArray;

/// Subcommands of `trainmem data`.
#[derive(Debug, clap::Subcommand)]
pub enum DataCommand {
    /// Validate files and print their format, dtype, shape, sample count and bytes per sample.
    /// Exits 0 only if every file is usable.
    Check(CheckArgs),
}

/// Arguments of `trainmem data check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// `.npy` files (versions 1-3) or raw record files with a `<file>.json` sidecar.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Also require every file to have the same number of samples (columns of one data set).
    #[arg(long)]
    pub same_length: bool,
    /// Print JSON lines instead of text: one object per file (`"ok"`, and `"error"` or the
    /// description), then, with `--same-length`, one `{"ok": false, "error": ...}` if the
    /// sample counts differ.
    #[arg(long)]
    pub json: bool,
}

/// Runs `trainmem data ...`.
pub fn run(cmd: DataCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DataCommand::Check(args) => check(&args),
    }
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let mut all_ok = true;
    let mut lengths = Vec::new();
    for path in &args.files {
        match MappedArray::open(path) {
            Ok(a) => {
                lengths.push((path.clone(), a.len()));
                if args.json {
                    let v = serde_json::json!({
                        "file": path.display().to_string(),
                        "ok": true,
                        "format": a.format().to_string(),
                        "dtype": a.dtype().name(),
                        "shape": a.shape(),
                        "samples": a.len(),
                        "bytes_per_sample": a.bytes_per_sample(),
                    });
                    println!("{v}");
                } else {
                    println!(
                        "{}: ok  {}  {}  shape {:?}  {} samples  {} bytes/sample",
                        path.display(),
                        a.format(),
                        a.dtype(),
                        a.shape(),
                        a.len(),
                        a.bytes_per_sample()
                    );
                }
            }
            Err(e) => {
                all_ok = false;
                if args.json {
                    let v = serde_json::json!({
                        "file": path.display().to_string(),
                        "ok": false,
                        "error": e.to_string(),
                    });
                    println!("{v}");
                } else {
                    // The error names the file itself.
                    println!("error  {e}");
                }
            }
        }
    }
    if args.same_length
        && let Some((_, first)) = lengths.first()
        && lengths.iter().any(|(_, n)| n != first)
    {
        all_ok = false;
        let counts: Vec<String> = lengths
            .iter()
            .map(|(p, n)| format!("{}={n}", p.display()))
            .collect();
        let message = format!("sample counts differ: {}", counts.join(", "));
        if args.json {
            // every line of --json is JSON, the mismatch too
            println!("{}", serde_json::json!({ "ok": false, "error": message }));
        } else {
            println!("error: {message}");
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
