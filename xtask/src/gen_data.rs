//! `cargo xtask gen-data`: write a deterministic fixture data set (`features.npy`, f32
//! `[samples, dim]`, and `labels.npy`, i64 or u8 `[samples]`).

use std::path::PathBuf;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use trainmem_core::Dtype;
use trainmem_loader::fixtures::{FixtureSpec, write_fixture};

/// Arguments of `gen-data`.
#[derive(Debug, clap::Args)]
pub struct GenDataArgs {
    /// Output directory (created if needed).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of samples.
    #[arg(long)]
    pub samples: usize,
    /// Features per sample.
    #[arg(long)]
    pub dim: usize,
    /// Seed of every value.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Number of label classes.
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    /// Store labels as u8 instead of i64.
    #[arg(long)]
    pub u8_labels: bool,
}

/// Writes fixture data sets.
pub fn run(args: GenDataArgs) -> anyhow::Result<ExitCode> {
    let spec = FixtureSpec {
        samples: args.samples,
        dim: args.dim,
        classes: args.classes,
        seed: args.seed,
        label_dtype: if args.u8_labels {
            Dtype::U8
        } else {
            Dtype::I64
        },
    };
    let paths = write_fixture_with_progress(&args.out, &spec)?;
    println!(
        "wrote {} and {} ({} samples, {} bytes of data)",
        paths.features.display(),
        paths.labels.display(),
        spec.samples,
        spec.data_bytes()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes a fixture, with a progress bar when it is large (over 64 MiB).
pub fn write_fixture_with_progress(
    out: &std::path::Path,
    spec: &FixtureSpec,
) -> anyhow::Result<trainmem_loader::fixtures::FixturePaths> {
    let total = spec.data_bytes();
    let bar = if total > 64 << 20 {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")?
                .progress_chars("=> "),
        );
        bar.set_message("writing fixture");
        Some(bar)
    } else {
        None
    };
    let paths = write_fixture(out, spec, |done, _| {
        if let Some(b) = &bar {
            b.set_position(done);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(paths)
}
