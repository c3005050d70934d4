//! Measured runs in a process of their own, so that what a run measures does not depend on what
//! ran before it.
//!
//! The figures a measured run reads from the operating system (RssAnon, RssFile, VmHWM) and the
//! counting allocator's `other` category count everything the process holds. A process that has
//! already trained a dozen models keeps part of their freed heap resident, or hands it back to
//! the next run's allocations, so in-process runs measure their own history as well as
//! themselves: a verdict could pass alone and fail in `all`.
//!
//! With [`Isolation::Child`], each measured run re-executes a binary that serves measured runs
//! (it calls [`serve_child`] first thing in `main`: `trainmem` and `cargo xtask` do), hands it
//! the plan and the run's options in a request file named by the [`CHILD_ENV`] environment
//! variable, shows the child's progress as it trains, and reads the whole [`MeasuredRun`] back
//! from a response file. Each run then starts from a fresh process whose own start-up memory is
//! recorded as the run's baseline ([`trainmem_core::timeline::TimelineMeta::baseline`]).
//!
//! A test binary can serve runs too: a test that calls [`serve_child`] and exits, run alone by
//! name ([`ChildCommand::test_harness`]).

use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use trainmem_burn::{MeasuredRun, RunOptions, run_measured_detailed};
use trainmem_core::Plan;

use super::error::{Result, ScenarioError};
use trainmem_burn::BackendChoice;

/// The environment variable that makes a serving binary run one measured run: the path of the
/// request file.
pub const CHILD_ENV: &str = "TRAINMEM_MEASURED_RUN";

/// The start of a progress line on the child's standard output (other lines, such as a test
/// harness's, are ignored).
const PROGRESS: &str = "trainmem-measured-run-progress";

/// Where measured runs are made.
#[derive(Debug, Clone, Default)]
pub enum Isolation {
    /// In this process, one after another (the figures read from the OS then include whatever
    /// earlier work left resident).
    #[default]
    InProcess,
    /// Each in a fresh child process started with this command.
    Child(ChildCommand),
}

/// How to start a child process that serves one measured run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCommand {
    /// The program (a binary that calls [`serve_child`] first thing in `main`).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl ChildCommand {
    /// The running binary itself, with no arguments (it must call [`serve_child`]).
    pub fn this_binary() -> std::io::Result<ChildCommand> {
        Ok(ChildCommand {
            program: std::env::current_exe()?,
            args: Vec::new(),
        })
    }

    /// The running test binary, asked to run only the test named `test` (a test that calls
    /// [`serve_child`] and exits with its code).
    pub fn test_harness(test: &str) -> std::io::Result<ChildCommand> {
        let mut cmd = ChildCommand::this_binary()?;
        cmd.args = [
            test,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        Ok(cmd)
    }
}

/// What a child is asked to run: the plan and every option of the run that can cross a process
/// boundary.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasuredRequest {
    /// The run's label (for messages).
    pub label: String,
    /// The plan to train.
    pub plan: Plan,
    /// The backend.
    pub backend: BackendChoice,
    /// [`RunOptions::work_dir`].
    pub work_dir: Option<PathBuf>,
    /// [`RunOptions::learning_rate`].
    pub learning_rate: f64,
    /// [`RunOptions::lazy_parameters`].
    pub lazy_parameters: bool,
    /// [`RunOptions::trace_allocations`].
    pub trace_allocations: Option<u64>,
    /// [`RunOptions::track_tensors`].
    #[serde(default = "tracked_by_default")]
    pub track_tensors: bool,
    /// Where the child writes its [`MeasuredResponse`].
    pub response: PathBuf,
}

fn tracked_by_default() -> bool {
    true
}

/// What a child sends back.
#[derive(Debug, Serialize, Deserialize)]
pub enum MeasuredResponse {
    /// The run, whole.
    Done(Box<MeasuredRun>),
    /// The run failed: the error and its causes, in words.
    Failed(String),
}

/// Serves one measured run when this process was started for it ([`CHILD_ENV`] is set):
/// trains, writes the response and returns the exit code for `main` to return. `None` when the
/// variable is not set, so `main` goes on as usual.
pub fn serve_child() -> Option<ExitCode> {
    serve_child_status().map(|status| ExitCode::from(status as u8))
}

/// [`serve_child`] with the exit status as a number, for callers that end the process
/// themselves (`std::process::exit`), such as a test: 0 when the run was sent back (a run that
/// failed is sent back too, as its error), 1 when no response could be written.
pub fn serve_child_status() -> Option<i32> {
    let request = std::env::var_os(CHILD_ENV)?;
    Some(match serve(Path::new(&request)) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("error: measured run in a child process: {message}");
            1
        }
    })
}

fn serve(request: &Path) -> std::result::Result<(), String> {
    let text = std::fs::read_to_string(request)
        .map_err(|e| format!("reading the request {}: {e}", request.display()))?;
    let req: MeasuredRequest = serde_json::from_str(&text)
        .map_err(|e| format!("the request {} does not parse: {e}", request.display()))?;
    let mut report = |p: trainmem_burn::Progress| {
        let mut out = std::io::stdout().lock();
        // The parent only shows these lines; a closed pipe must not stop the run.
        let _ = writeln!(out, "{PROGRESS} {} {}", p.step, p.total_steps);
        let _ = out.flush();
    };
    let opts = RunOptions {
        backend: {
            crate::ctx::backend_available(req.backend).map_err(|e| e.to_string())?;
            req.backend
        },
        work_dir: req.work_dir.clone(),
        learning_rate: req.learning_rate,
        progress: Some(&mut report),
        source: None,
        lazy_parameters: req.lazy_parameters,
        trace_allocations: req.trace_allocations,
        track_tensors: req.track_tensors,
    };
    let response = match run_measured_detailed(&req.plan, opts) {
        Ok(run) => MeasuredResponse::Done(Box::new(run)),
        Err(e) => MeasuredResponse::Failed(error_chain(&e)),
    };
    let json = serde_json::to_vec(&response).map_err(|e| format!("the response as JSON: {e}"))?;
    // Written whole, then renamed: the parent never reads half a response.
    let partial = req.response.with_extension("partial");
    std::fs::write(&partial, json)
        .and_then(|()| std::fs::rename(&partial, &req.response))
        .map_err(|e| format!("writing the response {}: {e}", req.response.display()))
}

/// An error and its causes, joined with `: `.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A request's options from the [`RunOptions`] a scenario configured; an option that cannot be
/// sent to another process (a batch source object) is an error naming the run.
pub(crate) fn request_from(
    label: &str,
    plan: &Plan,
    backend: BackendChoice,
    opts: &RunOptions<'_>,
) -> Result<MeasuredRequest> {
    if opts.source.is_some() {
        return Err(ScenarioError::Child {
            label: label.to_string(),
            detail: "a batch source object cannot be sent to another process; run it with \
                     Isolation::InProcess"
                .to_string(),
        });
    }
    Ok(MeasuredRequest {
        label: label.to_string(),
        plan: plan.clone(),
        backend,
        work_dir: opts.work_dir.clone(),
        learning_rate: opts.learning_rate,
        lazy_parameters: opts.lazy_parameters,
        trace_allocations: opts.trace_allocations,
        track_tensors: opts.track_tensors,
        response: PathBuf::new(),
    })
}

/// Makes the run `request` describes in a child started with `cmd`, reporting `(step, total)`
/// as the child trains, and returns the child's run.
pub fn measure_in_child(
    cmd: &ChildCommand,
    mut request: MeasuredRequest,
    mut on_progress: impl FnMut(u64, u64),
) -> Result<MeasuredRun> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let label = request.label.clone();
    let fail = |detail: String| ScenarioError::Child {
        label: label.clone(),
        detail,
    };
    let dir = std::env::temp_dir().join(format!(
        "trainmem-measured-run-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let _cleanup = RemoveOnDrop(dir.clone());
    let request_path = dir.join("request.json");
    request.response = dir.join("response.json");
    let json = serde_json::to_vec(&request).map_err(|e| fail(format!("the request: {e}")))?;
    std::fs::write(&request_path, json)
        .map_err(|e| fail(format!("writing {}: {e}", request_path.display())))?;

    let mut child = Command::new(&cmd.program)
        .args(&cmd.args)
        .env(CHILD_ENV, &request_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| fail(format!("starting {}: {e}", cmd.program.display())))?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out)
            .lines()
            .map_while(std::result::Result::ok)
        {
            if let Some((step, total)) = parse_progress(&line) {
                on_progress(step, total);
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| fail(format!("waiting for {}: {e}", cmd.program.display())))?;
    let text = match std::fs::read_to_string(&request.response) {
        Ok(text) => text,
        Err(_) => {
            return Err(fail(format!(
                "{} exited ({status}) without sending a run back; a binary that serves measured \
                 runs calls trainmem_scenarios::isolate::serve_child() first thing in main",
                cmd.program.display()
            )));
        }
    };
    match serde_json::from_str(&text) {
        Ok(MeasuredResponse::Done(run)) => Ok(*run),
        Ok(MeasuredResponse::Failed(message)) => Err(fail(message)),
        Err(e) => Err(fail(format!("the child's response does not parse: {e}"))),
    }
}

/// `(step, total)` from a progress line.
fn parse_progress(line: &str) -> Option<(u64, u64)> {
    let mut words = line.strip_prefix(PROGRESS)?.split_whitespace();
    let step = words.next()?.parse().ok()?;
    let total = words.next()?.parse().ok()?;
    Some((step, total))
}

/// Removes the request directory however the run ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_read_and_other_lines_ignored() {
        assert_eq!(
            parse_progress("trainmem-measured-run-progress 3 12"),
            Some((3, 12))
        );
        assert_eq!(parse_progress("running 1 test"), None);
        assert_eq!(parse_progress("trainmem-measured-run-progress x 12"), None);
    }

    #[test]
    fn a_binary_that_does_not_serve_is_named_in_the_error() {
        // `true` exits 0 and writes nothing back: the error must say what a serving binary
        // does, not report an empty run.
        let cmd = ChildCommand {
            program: PathBuf::from("true"),
            args: Vec::new(),
        };
        let plan = crate::plans::load("optimizer-jump").expect("plan");
        let req = request_from("probe", &plan, BackendChoice::Flex, &RunOptions::default())
            .expect("request");
        let err = measure_in_child(&cmd, req, |_, _| {}).expect_err("no response");
        let text = err.to_string();
        assert!(text.contains("without sending a run back"), "{text}");
        assert!(text.contains("serve_child"), "{text}");
    }

    #[test]
    fn a_source_object_cannot_cross_processes() {
        let plan = crate::plans::load("optimizer-jump").expect("plan");
        let (shape, _) = trainmem_burn::example_shape(&plan.model).expect("shape");
        let opts = RunOptions {
            source: Some(Box::new(trainmem_burn::SyntheticSource::new(shape, 1))),
            ..RunOptions::default()
        };
        let err = request_from("probe", &plan, BackendChoice::Flex, &opts).expect_err("refused");
        assert!(err.to_string().contains("InProcess"), "{err}");
    }
}
