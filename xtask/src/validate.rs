//! `cargo xtask validate pytorch`: the twin against recorded PyTorch runs;
//! `cargo xtask validate profiler`: `trainmem explain`'s categories against torch.profiler's.
//!
//! Reads every ledger under `fixtures/pytorch/`, `fixtures/pytorch-cuda/<device>/` and
//! `fixtures/pytorch-fake-cuda/<suite>/` (written by `validation/pytorch/record.py`, the GPU
//! ones by `validation/pytorch/record_cuda.sh`, the fake-CUDA ones by `record.py --device
//! fake-cuda`: one forward pass each),
//! simulates the same run and prints each category's peak beside the recorded one with its
//! accuracy target (`trainmem_sim::validation`). No Python is needed; recording is a separate
//! step (`--record`, which runs the script in a virtual environment of its own).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use trainmem_sim::validation::{compare, ledger_paths, load, render};

/// `cargo xtask validate ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ValidateCommand {
    /// Compare the twin with the recorded PyTorch runs (fixtures/pytorch/).
    Pytorch(PytorchArgs),
    /// Compare `trainmem explain`'s categories of a snapshot with torch.profiler's memory
    /// categories of the same run (fixtures/pytorch-profiled/).
    Profiler(ProfilerArgs),
}

/// Arguments of `validate profiler`.
#[derive(Debug, clap::Args)]
pub struct ProfilerArgs {
    /// Profile the runs first: run validation/pytorch/profile_truth.py on the CPU in
    /// `target/validation-venv` into fixtures/pytorch-profiled/cpu/ (19 runs, about 90 s).
    #[arg(long)]
    pub record: bool,
    /// Compare the runs under this folder instead of fixtures/pytorch-profiled/.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also list, per run, the bytes of each (profiler category, trainmem category) pair.
    #[arg(long)]
    pub confusion: bool,
}

/// The share of compared bytes `validate profiler` asks of every run, with frames: over all
/// allocations, at the peak and over those the profiler's data flow names.
pub const PROFILER_AGREEMENT: f64 = 0.998;

/// Arguments of `validate pytorch`.
#[derive(Debug, clap::Args)]
pub struct PytorchArgs {
    /// Record the runs first: create `target/validation-venv` with
    /// validation/pytorch/requirements.txt and run record.py into fixtures/pytorch/.
    #[arg(long)]
    pub record: bool,
    /// Record the fake-CUDA runs first, in the same environment: the GPU suite and the
    /// families at their published sizes, one forward pass each on fake CUDA tensors, into
    /// fixtures/pytorch-fake-cuda/ (about a minute; no GPU needed).
    #[arg(long)]
    pub record_fake_cuda: bool,
    /// Only runs whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// Compare the recordings under this folder instead of fixtures/pytorch/ and
    /// fixtures/pytorch-cuda/ (e.g. `record_cuda.sh`'s output before it is committed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs `cargo xtask validate ...`.
pub fn run(cmd: ValidateCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ValidateCommand::Pytorch(args) => pytorch(args),
        ValidateCommand::Profiler(args) => profiler(args),
    }
}

/// The recording environment, `target/validation-venv`: made when missing, its packages
/// installed from validation/pytorch/'s requirement files. Returns its interpreter.
fn environment() -> anyhow::Result<PathBuf> {
    let root = root();
    let venv = crate::target_dir().join("validation-venv");
    let python = venv.join("bin/python");
    if !python.is_file() {
        eprintln!("creating {}", venv.display());
        status(
            std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv),
        )?;
    }
    let reqs = root.join("validation/pytorch");
    for file in ["requirements.txt", "requirements-litgpt.txt"] {
        status(
            std::process::Command::new(&python)
                .args(["-m", "pip", "install", "-q", "-r"])
                .arg(reqs.join(file)),
        )?;
    }
    // litgpt, whose own pins conflict with transformers' (see the file)
    status(
        std::process::Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--no-deps", "-r"])
            .arg(reqs.join("requirements-nodeps.txt")),
    )?;
    Ok(python)
}

/// Runs `cmd`, failing when it does.
fn status(cmd: &mut std::process::Command) -> anyhow::Result<()> {
    let s = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !s.success() {
        bail!("{cmd:?} exited with {s}");
    }
    Ok(())
}

/// Records the GPU suite and the families on fake CUDA tensors into
/// fixtures/pytorch-fake-cuda/`<suite>`/.
fn record_fake_cuda() -> anyhow::Result<()> {
    let python = environment()?;
    let root = root();
    for (suite, folder) in [("cuda", "gpu-suite"), ("families", "families")] {
        eprintln!("recording the {suite} suite on fake CUDA tensors");
        status(
            std::process::Command::new(&python)
                .arg(root.join("validation/pytorch/record.py"))
                .args(["--suite", suite, "--device", "fake-cuda", "--out"])
                .arg(root.join("fixtures/pytorch-fake-cuda").join(folder)),
        )?;
    }
    Ok(())
}

/// Records the CPU suite into fixtures/pytorch/.
fn record() -> anyhow::Result<()> {
    let python = environment()?;
    let root = root();
    status(
        std::process::Command::new(&python)
            .arg(root.join("validation/pytorch/record.py"))
            .arg("--out")
            .arg(root.join("fixtures/pytorch")),
    )
}

fn pytorch(args: PytorchArgs) -> anyhow::Result<ExitCode> {
    if args.record {
        record()?;
    }
    if args.record_fake_cuda {
        record_fake_cuda()?;
    }
    // the CPU ledgers, then the GPU ones (fixtures/pytorch-cuda/<device>/) where recorded, then
    // the fake-CUDA ones
    let dirs = match &args.dir {
        Some(dir) => vec![dir.clone()],
        None => vec![
            root().join("fixtures/pytorch"),
            root().join("fixtures/pytorch-cuda"),
            root().join("fixtures/pytorch-fake-cuda"),
        ],
    };
    let mut paths = Vec::new();
    for dir in &dirs {
        paths.extend(ledger_paths(dir).with_context(|| format!("reading {}", dir.display()))?);
    }
    if paths.is_empty() {
        bail!("no recordings under {dirs:?}");
    }
    let (mut rows, mut misses) = (0, 0);
    for path in paths {
        let rec = load(&path)?;
        if args
            .only
            .as_ref()
            .is_some_and(|o| !rec.name.contains(o.as_str()))
        {
            continue;
        }
        let c = compare(&rec)?;
        print!("{}", render(&c));
        rows += c.rows.len();
        misses += c.rows.iter().filter(|r| !r.within()).count();
    }
    println!("{misses} of {rows} figures outside their target");
    Ok(if misses == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `validate profiler`: every profiled run's categories beside torch.profiler's.
fn profiler(args: ProfilerArgs) -> anyhow::Result<ExitCode> {
    use trainmem_sim::snapshot_explain::profiler_truth::{
        compare, compare_without_frames, profiled_runs, render_table,
    };
    if args.record {
        let python = environment()?;
        status(
            std::process::Command::new(&python)
                .arg(root().join("validation/pytorch/profile_truth.py"))
                .arg("--out")
                .arg(root().join("fixtures/pytorch-profiled")),
        )?;
    }
    let dir = args
        .dir
        .unwrap_or_else(|| root().join("fixtures/pytorch-profiled"));
    let runs = profiled_runs(&dir).with_context(|| format!("reading {}", dir.display()))?;
    if runs.is_empty() {
        bail!(
            "no profiled runs (NAME.truth.json beside NAME.pickle) under {}",
            dir.display()
        );
    }
    let mut rows = Vec::new();
    for run in &runs {
        let c = compare(&run.snapshot, &run.truth)
            .with_context(|| format!("comparing {}", run.truth.name))?;
        let bare = compare_without_frames(&run.snapshot, &run.truth)
            .with_context(|| format!("comparing {} without frames", run.truth.name))?;
        rows.push((c, bare));
    }
    print!("{}", render_table(&rows));
    if args.confusion {
        for (c, bare) in &rows {
            println!("{}: profiler category -> trainmem category, bytes", c.name);
            for (p, t, b) in &c.confusion {
                println!("  {:<16} -> {:<16} {b:>12}", p.name(), t.name());
            }
            println!("  at the peak: category, profiler, trainmem, trainmem without frames");
            for (cat, p, t) in &c.peak_by_category {
                println!("  {:<16} {p:>12} {t:>12}", cat.name());
            }
            for (cat, p, t) in &bare.peak_by_category {
                println!("  {:<16} {p:>12} {:>12} {t:>12}", cat.name(), "");
            }
        }
    }
    let below: Vec<&str> = rows
        .iter()
        .filter(|(c, _)| {
            [c.all.share(), c.at_peak.share(), c.by_data_flow.share()]
                .iter()
                .any(|&s| s < PROFILER_AGREEMENT)
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    println!(
        "{} of {} runs agree with torch.profiler on at least {:.1}% of bytes (all, at the peak, by data flow)",
        rows.len() - below.len(),
        rows.len(),
        100.0 * PROFILER_AGREEMENT
    );
    if !below.is_empty() {
        println!("below: {}", below.join(", "));
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
