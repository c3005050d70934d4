//! `trainmem data`: inspect data-set files (memory-mapped `.npy` and raw record files, token
//! files, indexed token data sets, Arrow IPC files and streams, safetensors).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use trainmem_core::Dtype;
use trainmem_loader::{DataError, FileProblem};

use crate::data_describe::{TokenOptions, describe};

/// Subcommands of `trainmem data`.
#[derive(Debug, clap::Subcommand)]
pub enum DataCommand {
    /// Validate files and print their format, dtype, shape or columns, sample count and bytes
    /// per sample. Exits 0 only if every file is usable.
    #[command(after_help = RAW_SIDECAR_HELP)]
    Check(CheckArgs),
}

/// Arguments of `trainmem data check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// `.npy` files (versions 1-3), raw record files with a `<file>.json` sidecar, flat token
    /// files (`.bin`, with `--token-dtype`), Megatron indexed data sets (`.idx` or its `.bin`),
    /// Arrow IPC files or streams (`.arrow`, e.g. a `datasets` cache file) and `.safetensors`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Read `.bin` files without a sidecar or `.idx` as flat token files (nanoGPT's
    /// `train.bin`) of this element type: u8, u16, u32, i32 or i64.
    #[arg(long, value_parser = parse_token_dtype)]
    pub token_dtype: Option<Dtype>,
    /// Check that every token id of token files and indexed data sets is below this.
    #[arg(long)]
    pub vocab: Option<u64>,
    /// Also require every file to have the same number of samples (columns of one data set).
    #[arg(long)]
    pub same_length: bool,
    /// Print JSON lines instead of text: one object per file (`"ok"`, and `"error"` or the
    /// description), then, with `--same-length`, one `{"ok": false, "error": ...}` if the
    /// sample counts differ.
    #[arg(long)]
    pub json: bool,
}

/// `data check --help`'s account of the raw sidecar and of token files.
const RAW_SIDECAR_HELP: &str = "\
Raw record files: a file of fixed-size records without a header is described by a JSON
sidecar beside it, named after it with .json appended (images.bin -> images.bin.json):
  {\"dtype\": \"<f4\", \"sample_shape\": [3, 32, 32], \"offset\": 0}
dtype is numpy's spelling of the element type (<f4, <f2, <i8, |u1, ...); sample_shape the
shape of one record ([] for one value per record); offset (optional, default 0) the bytes
to skip before the first record. Token files (nanoGPT's train.bin) need no sidecar: pass
--token-dtype u16 (or u32 for a vocabulary over 65536).

Exit status: 0 every file is usable; 1 a file is not (or --same-length counts differ);
2 the command line itself is wrong.";

/// Runs `trainmem data ...`.
pub fn run(cmd: DataCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DataCommand::Check(args) => check(&args),
    }
}

fn parse_token_dtype(s: &str) -> Result<Dtype, String> {
    trainmem_loader::TOKEN_DTYPES
        .into_iter()
        .find(|d| d.name() == s)
        .ok_or_else(|| format!("{s:?} is not a token type (u8, u16, u32, i32, i64)"))
}

/// The error's message, with what to do about a file that is neither `.npy` nor described
/// by a sidecar: a `.bin` is most likely a token file, which needs `--token-dtype`.
fn with_hint(e: &DataError, path: &Path) -> String {
    let unrecognised = matches!(
        e,
        DataError::File {
            problem: FileProblem::Unrecognised { .. },
            ..
        }
    );
    match (unrecognised, path.extension().and_then(|x| x.to_str())) {
        (true, Some("bin")) => {
            format!("{e}; for a token file (nanoGPT's train.bin), pass --token-dtype u16|u32")
        }
        (true, _) => format!("{e} (`trainmem data check --help` describes the sidecar)"),
        (false, _) => e.to_string(),
    }
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let mut all_ok = true;
    let mut lengths = Vec::new();
    let tokens = TokenOptions {
        dtype: args.token_dtype,
        vocab: args.vocab,
    };
    for path in &args.files {
        match describe(path, tokens) {
            Ok(d) => {
                lengths.push((path.clone(), d.samples));
                if args.json {
                    println!("{}", d.json(path));
                } else {
                    println!("{}", d.line(path));
                }
            }
            Err(e) => {
                all_ok = false;
                let e = with_hint(&e, path);
                if args.json {
                    let v = serde_json::json!({
                        "file": path.display().to_string(),
                        "ok": false,
                        "error": e,
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
