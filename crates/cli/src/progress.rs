//! Progress of long simulations on stderr: a bar on a terminal, a line every few seconds
//! otherwise (a log, a pipe, CI), nothing under `--quiet`.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Seconds between lines when stderr is not a terminal.
const QUIET_LOG_EVERY: Duration = Duration::from_secs(5);
/// Seconds between lines under `--progress`.
const ASKED_EVERY: Duration = Duration::from_secs(2);

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressFlags {
    /// `--quiet`: nothing.
    pub quiet: bool,
    /// `--progress`: lines every few seconds, on a terminal too, for any length of run.
    pub lines: bool,
    /// A bar is not wanted even on a terminal (`--json` output).
    pub no_bar: bool,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing.
    Silent,
    /// A terminal progress bar.
    Bar,
    /// A line on stderr at most this often.
    Lines(Duration),
}

/// The mode for `flags` when stderr is (`terminal`) or is not a terminal, for a run of
/// `total` steps: a bar only on a terminal and for runs long enough to watch (200 steps);
/// lines otherwise, which appear only once a run has lasted a few seconds.
pub fn mode(flags: ProgressFlags, terminal: bool, total: u64) -> Mode {
    if flags.quiet {
        Mode::Silent
    } else if flags.lines {
        Mode::Lines(ASKED_EVERY)
    } else if terminal && !flags.no_bar {
        if total >= 200 {
            Mode::Bar
        } else {
            Mode::Silent
        }
    } else {
        Mode::Lines(QUIET_LOG_EVERY)
    }
}

/// Lines of progress, at most one per `every`.
#[derive(Debug)]
pub struct Lines {
    what: &'static str,
    every: Duration,
    start: Instant,
    last: Instant,
}

impl Lines {
    /// Lines about `what` (e.g. `simulating`), from `start`.
    pub fn new(what: &'static str, every: Duration, start: Instant) -> Lines {
        Lines {
            what,
            every,
            start,
            last: start,
        }
    }

    /// The line to print at `now` for `done` of `total` steps, if one is due.
    pub fn tick(&mut self, done: u64, total: u64, now: Instant) -> Option<String> {
        if now.duration_since(self.last) < self.every {
            return None;
        }
        self.last = now;
        let pct = (u128::from(done) * 100)
            .checked_div(u128::from(total))
            .unwrap_or(100);
        Some(format!(
            "{}: step {done} of {total} ({pct}%) after {:.1} s",
            self.what,
            now.duration_since(self.start).as_secs_f64()
        ))
    }

    /// A line due at `now` about an event (`fit`'s probes), if one is due.
    pub fn note(&mut self, text: &str, now: Instant) -> Option<String> {
        if now.duration_since(self.last) < self.every {
            return None;
        }
        self.last = now;
        Some(format!(
            "{}: {text} after {:.1} s",
            self.what,
            now.duration_since(self.start).as_secs_f64()
        ))
    }
}

/// Progress of one simulation of `total` steps as the command shows it.
pub enum Reporter {
    /// Nothing.
    Silent,
    /// A bar.
    Bar(ProgressBar),
    /// Lines on stderr.
    Lines(Lines),
}

impl Reporter {
    /// The reporter for `flags` on this process's stderr, for a run of `total` steps.
    pub fn new(what: &'static str, flags: ProgressFlags, total: u64) -> Reporter {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        match mode(flags, terminal, total) {
            Mode::Silent => Reporter::Silent,
            Mode::Lines(every) => Reporter::Lines(Lines::new(what, every, Instant::now())),
            Mode::Bar => {
                let b = ProgressBar::new(total);
                if let Ok(style) = ProgressStyle::with_template(&format!(
                    "{what} {{bar:40}} {{pos}}/{{len}} steps ({{eta}})"
                )) {
                    b.set_style(style);
                }
                Reporter::Bar(b)
            }
        }
    }

    /// `done` of `total` steps are simulated.
    pub fn step(&mut self, done: u64, total: u64) {
        match self {
            Reporter::Silent => {}
            Reporter::Bar(b) => {
                if done.is_multiple_of(16) || done == total {
                    b.set_position(done);
                }
            }
            Reporter::Lines(l) => {
                if let Some(line) = l.tick(done, total, Instant::now()) {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// Something happened worth a line (lines only).
    pub fn note(&mut self, text: &str) {
        if let Reporter::Lines(l) = self
            && let Some(line) = l.note(text, Instant::now())
        {
            eprintln!("{line}");
        }
    }

    /// The run is over: the bar goes.
    pub fn finish(self) {
        if let Reporter::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: ProgressFlags = ProgressFlags {
        quiet: false,
        lines: false,
        no_bar: false,
    };

    #[test]
    fn quiet_wins_and_progress_asks_for_lines_everywhere() {
        let quiet = ProgressFlags {
            quiet: true,
            lines: true,
            ..NONE
        };
        for terminal in [false, true] {
            assert_eq!(mode(quiet, terminal, 10_000), Mode::Silent);
            let asked = ProgressFlags {
                lines: true,
                ..NONE
            };
            assert_eq!(mode(asked, terminal, 1), Mode::Lines(ASKED_EVERY));
        }
    }

    #[test]
    fn a_terminal_gets_a_bar_for_long_runs_and_anything_else_gets_lines() {
        assert_eq!(mode(NONE, true, 200), Mode::Bar);
        assert_eq!(mode(NONE, true, 199), Mode::Silent);
        // not a terminal (a log file, a pipe): lines, whatever the length of the run
        assert_eq!(mode(NONE, false, 1), Mode::Lines(QUIET_LOG_EVERY));
        assert_eq!(mode(NONE, false, 10_000), Mode::Lines(QUIET_LOG_EVERY));
        // JSON on a terminal: no bar over the output, lines on stderr instead
        let json = ProgressFlags {
            no_bar: true,
            ..NONE
        };
        assert_eq!(mode(json, true, 10_000), Mode::Lines(QUIET_LOG_EVERY));
    }

    #[test]
    fn lines_come_at_most_once_per_interval() {
        let t0 = Instant::now();
        let every = Duration::from_secs(5);
        let mut l = Lines::new("simulating", every, t0);
        assert_eq!(l.tick(1, 400, t0 + Duration::from_secs(1)), None);
        assert_eq!(
            l.tick(100, 400, t0 + Duration::from_secs(5)).as_deref(),
            Some("simulating: step 100 of 400 (25%) after 5.0 s")
        );
        assert_eq!(l.tick(101, 400, t0 + Duration::from_secs(9)), None);
        assert_eq!(
            l.tick(399, 400, t0 + Duration::from_millis(10_500))
                .as_deref(),
            Some("simulating: step 399 of 400 (99%) after 10.5 s")
        );
        assert_eq!(
            l.note("batch size 8 fits", t0 + Duration::from_secs(16))
                .as_deref(),
            Some("simulating: batch size 8 fits after 16.0 s")
        );
    }
}
