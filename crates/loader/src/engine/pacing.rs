//! How the caller waits for a batch from the workers: polling for a while before it sleeps
//! when batches have been arriving quickly, busily when a CPU is free for it and between yields
//! of its CPU when the workers fill every CPU.
//!
//! A caller that sleeps for every batch must be woken by the worker that sends it: a futex
//! wake in the worker and, when the caller's CPU is idle, an interrupt to it. With batches
//! built in tens of microseconds that is a wake per batch, paid by the worker on every batch.
//! And when the two threads happen to share a CPU they take turns on it (each waits for the
//! other in the channel's spin-then-yield loop, so neither sleeps and nothing moves either of
//! them) while the other CPU idles. Both were seen with `perf sched` on trainmem's
//! `loader-formats` bench with one worker on two CPUs.
//!
//! So with fewer workers than CPUs (one is then free for the caller), a caller whose recent
//! waits were shorter than [`SPIN_MAX`] (a running average kept by [`SpinWait`]) polls the
//! results for up to [`SPIN_MAX`] before it sleeps, unless it is running on a CPU where a
//! worker last handed a batch over ([`WorkerCpus`]): polling there would only delay that
//! worker, while a caller that sleeps is placed again by the wake-up, on an idle CPU if there
//! is one. It polls without yielding: yielding to another process on its CPU would hand that
//! process a whole time slice before the caller looks again, while a sleeping caller that is
//! woken preempts it. A caller that polls is not woken by its worker at all. When batches take
//! longer than that to arrive (large batches, slow transforms, a consumer slower than its
//! workers) the average rises above [`SPIN_MAX`] and the caller sleeps at once, as it did
//! before. With as many workers as CPUs or more, polling would take a CPU from a worker: the
//! caller sleeps.
//!
//! Two things stop the polling for a while, both seen by the poll itself: a gap of more than
//! [`PREEMPTED_GAP`] between two looks at the channel (the caller lost its CPU in the middle
//! of polling: another thread, a worker or another process, wanted it), and a poll that runs
//! out of its budget with no batch (the worker was slower than usual, or was itself
//! preempted). Either makes the next waits sleep at once: [`BACK_OFF_FIRST`] of them after
//! the first such poll, twice as many after each further one, up to [`BACK_OFF_MOST`], until
//! [`CLEAN_POLLS`] polls in a row find their batch. Shorter pauses do not count: on the
//! 2-vCPU virtual machine trainmem is benchmarked on, a polling thread loses its CPU for
//! 20–40 µs about every 20 ms (interrupts, the host), far less than the time slice another
//! runnable thread would take. Another process that keeps wanting the CPU finds the caller
//! asleep almost all the time. Only time spent polling counts: what the caller's
//! thread does between waits (the training step, or another loader's epoch) never stops it.
//!
//! With as many workers as CPUs or more, no CPU is free for the caller to poll on
//! ([`Pacing::WorkersYield`]): each worker yields its CPU after handing a batch over, so that a
//! caller waiting on that CPU runs at once, and the caller, under the same running average and
//! back-off, looks for its batch between yields of its own CPU ([`SpinWait::yield_between`])
//! instead of in the channel's blocking receive. That receive spins on the CPU before it
//! yields or sleeps, and on a CPU shared with a worker every microsecond of it is the worker's.
//! Two threads pinned to one CPU of trainmem's 2-vCPU benchmark machine, meeting as the caller
//! and a worker do (`xtask bench loader-formats` prints this round trip), took 4.9–5.1 µs a
//! round trip with blocking receives on both sides and 1.3–2.4 µs (over the runs of
//! 2026-11-26) with the caller looking between yields; a caller that sleeps at once (a mutex
//! and condition variable, in a temporary program) took 2.9–3.3 µs. On the bench's packed
//! Arrow row with 2 and 4 workers the caller's CPU time fell from about 3.2 to 2.0 ms an epoch
//! of 1,024 batches. A caller that yields and finds no one else wanting its CPU gets it
//! straight back and looks again, so with the CPUs idle (workers waiting on the disk) it spins
//! for up to [`SPIN_MAX`], as a polling caller with a free CPU does, and a miss makes the next
//! waits sleep at once. [`current_cpu`] also serves the staging pool, which hands a thread the
//! buffer it last wrote on the same CPU, and the loader benches, which pin threads by it.
//!
//! The polling changes when the caller notices a batch, never which batch it delivers, in
//! which order, or how many are in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The longest the caller polls for a batch before it sleeps.
pub(crate) const SPIN_MAX: Duration = Duration::from_micros(100);

/// A gap this long between two looks at the channel means the polling caller lost its CPU.
pub(crate) const PREEMPTED_GAP: Duration = Duration::from_micros(250);

/// How many waits sleep at once after the first poll that missed or lost its CPU.
pub(crate) const BACK_OFF_FIRST: u32 = 16;

/// The most waits that sleep at once after a run of such polls.
pub(crate) const BACK_OFF_MOST: u32 = 1024;

/// Polls in a row that find their batch before the back-off starts again from
/// [`BACK_OFF_FIRST`].
pub(crate) const CLEAN_POLLS: u32 = 256;

/// The CPU the calling thread is running on, where the platform says (Linux); the thread may
/// move right after, so it is a hint. `None` elsewhere, or when the platform cannot tell.
pub fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's CPU
        // number; it returns -1 on failure, which `try_from` turns into `None`.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).ok()
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The CPU each worker was on when it last handed a batch over (`usize::MAX`: not yet known).
#[derive(Debug)]
pub(crate) struct WorkerCpus(Vec<AtomicUsize>);

impl WorkerCpus {
    /// Nothing known yet for `workers` workers.
    pub(crate) fn new(workers: usize) -> WorkerCpus {
        WorkerCpus((0..workers).map(|_| AtomicUsize::new(usize::MAX)).collect())
    }

    /// Notes the CPU worker `id` (the calling thread) is running on.
    pub(crate) fn note(&self, id: usize) {
        if let (Some(slot), Some(cpu)) = (self.0.get(id), current_cpu()) {
            slot.store(cpu, Ordering::Relaxed);
        }
    }

    /// Whether a worker was last seen on `cpu`.
    pub(crate) fn any_on(&self, cpu: usize) -> bool {
        self.0.iter().any(|c| c.load(Ordering::Relaxed) == cpu)
    }
}

/// How the caller and the workers of a loader meet at each hand-over, chosen once from the
/// worker count and the CPUs this process may run on ([`std::thread::available_parallelism`],
/// which counts the affinity mask and a cgroup quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pacing {
    /// No workers: batches are built in the caller, nothing is handed over.
    Inline,
    /// Fewer workers than CPUs: the caller polls for batches before it sleeps (see the module
    /// docs and [`SpinWait`]).
    CallerPolls,
    /// As many workers as CPUs or more, so no CPU is left free for the caller: a worker yields
    /// its CPU after handing a batch over, and the caller looks for its batch between yields of
    /// its own CPU before it sleeps (see the module docs).
    ///
    /// The caller, asleep until its batch arrives, is woken by the worker's send; with every
    /// CPU busy with a worker it then waits to be given one, and under Linux's EEVDF scheduler
    /// that is often the rest of a worker's time slice (milliseconds), while the batches in
    /// flight fill up and the workers stop for want of tasks. On trainmem's `loader-formats`
    /// bench (2 CPUs, 2 workers, batches built in 15–30 µs) the caller spent 75–85% of each
    /// epoch runnable but not running. A yield right after the send hands the CPU to the
    /// caller if it is queued there and costs one system call per batch when it is not.
    WorkersYield,
}

impl Pacing {
    /// The pacing of a loader with `workers` workers on this process's CPUs.
    pub(crate) fn for_workers(workers: usize) -> Pacing {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Pacing::with(workers, cpus)
    }

    fn with(workers: usize, cpus: usize) -> Pacing {
        match workers {
            0 => Pacing::Inline,
            w if w < cpus => Pacing::CallerPolls,
            _ => Pacing::WorkersYield,
        }
    }
}

/// How a poll ended (see [`SpinWait::spin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polled<T> {
    /// The poll found this.
    Found(T),
    /// [`SPIN_MAX`] passed with nothing found.
    Missed,
    /// The caller lost its CPU while polling (a gap of [`PREEMPTED_GAP`] or more).
    Preempted,
}

impl<T> Polled<T> {
    /// What was found, and how the poll ended without it.
    pub(crate) fn split(self) -> (Option<T>, Polled<()>) {
        match self {
            Polled::Found(t) => (Some(t), Polled::Found(())),
            Polled::Missed => (None, Polled::Missed),
            Polled::Preempted => (None, Polled::Preempted),
        }
    }
}

/// The caller's wait for batches: a running average of how long each wait took decides whether
/// the next one polls first.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SpinWait {
    /// Exponential moving average of the waits, in nanoseconds (weight 1/4 for the newest).
    average_ns: u64,
    /// Waits left during which the caller sleeps at once.
    backing_off: u32,
    /// The back-off after the next poll that misses or loses its CPU (0: [`BACK_OFF_FIRST`]).
    next_back_off: u32,
    /// Polls in a row that found their batch.
    clean: u32,
}

impl SpinWait {
    /// Whether the next wait should poll before it sleeps: the recent waits were short and no
    /// back-off is running.
    pub(crate) fn worth_spinning(&self) -> bool {
        self.backing_off == 0 && self.average_ns < SPIN_MAX.as_nanos() as u64
    }

    /// Records a wait of `waited` (from asking for a batch to having it), and how its poll
    /// ended when it polled.
    pub(crate) fn record<T>(&mut self, waited: Duration, polled: Option<&Polled<T>>) {
        let w = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.average_ns = (self.average_ns.saturating_mul(3) / 4).saturating_add(w / 4);
        match polled {
            Some(Polled::Found(_)) => {
                self.clean = self.clean.saturating_add(1);
                if self.clean >= CLEAN_POLLS {
                    self.next_back_off = 0;
                }
            }
            Some(Polled::Missed | Polled::Preempted) => {
                self.backing_off = self.next_back_off.max(BACK_OFF_FIRST);
                self.next_back_off = (self.backing_off * 2).min(BACK_OFF_MOST);
                self.clean = 0;
            }
            None => self.backing_off = self.backing_off.saturating_sub(1),
        }
    }

    /// Polls `poll` until it returns `Some`, [`SPIN_MAX`] has passed since `start`, or a gap
    /// of [`PREEMPTED_GAP`] between two looks shows the caller lost its CPU.
    pub(crate) fn spin<T>(start: Instant, mut poll: impl FnMut() -> Option<T>) -> Polled<T> {
        let mut last = start;
        loop {
            if let Some(t) = poll() {
                return Polled::Found(t);
            }
            let now = Instant::now();
            if now.duration_since(last) >= PREEMPTED_GAP {
                return Polled::Preempted;
            }
            if now.duration_since(start) >= SPIN_MAX {
                return Polled::Missed;
            }
            last = now;
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
    }

    /// Polls `poll` until it returns `Some` or [`SPIN_MAX`] has passed since `start`, giving
    /// the CPU away between looks ([`Pacing::WorkersYield`]): a worker queued on the caller's
    /// CPU runs at once, and the caller looks again when it gets the CPU back. Losing the CPU
    /// is the point here, so a poll never ends [`Polled::Preempted`].
    pub(crate) fn yield_between<T>(
        start: Instant,
        mut poll: impl FnMut() -> Option<T>,
    ) -> Polled<T> {
        loop {
            if let Some(t) = poll() {
                return Polled::Found(t);
            }
            if start.elapsed() >= SPIN_MAX {
                return Polled::Missed;
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caller_polls_with_a_cpu_free_and_workers_yield_when_they_fill_every_cpu() {
        use Pacing::{CallerPolls, Inline, WorkersYield};
        for (workers, cpus, want, why) in [
            (
                0,
                2,
                Inline,
                "no workers: batches are built in the caller, nobody yields",
            ),
            (1, 2, CallerPolls, "a CPU is free for the caller"),
            (3, 4, CallerPolls, "a CPU is free for the caller"),
            (2, 2, WorkersYield, "the workers fill every CPU"),
            (4, 2, WorkersYield, "more workers than CPUs"),
            (1, 1, WorkersYield, "one worker on the only CPU"),
        ] {
            assert_eq!(
                Pacing::with(workers, cpus),
                want,
                "{workers} workers on {cpus} CPUs: {why}"
            );
        }
    }

    #[test]
    fn workers_are_found_on_the_cpu_they_noted() {
        let cpus = WorkerCpus::new(2);
        assert!(!cpus.any_on(0) && !cpus.any_on(1), "nothing known yet");
        cpus.note(1);
        cpus.note(7); // no such worker: ignored
        let noted = cpus.0[1].load(Ordering::Relaxed);
        assert_eq!(cpus.0[0].load(Ordering::Relaxed), usize::MAX);
        #[cfg(target_os = "linux")]
        {
            assert_ne!(noted, usize::MAX, "Linux says which CPU a thread is on");
            assert!(cpus.any_on(noted));
            assert!(current_cpu().is_some());
        }
        #[cfg(not(target_os = "linux"))]
        assert_eq!(noted, usize::MAX);
    }

    const FOUND: Option<&Polled<()>> = Some(&Polled::Found(()));

    #[test]
    fn polling_stops_after_long_waits_and_resumes_after_short_ones() {
        let mut w = SpinWait::default();
        assert!(w.worth_spinning(), "a fresh wait polls first");
        for _ in 0..8 {
            w.record(Duration::from_millis(2), None::<&Polled<()>>);
        }
        assert!(!w.worth_spinning(), "batches 2 ms apart: sleep at once");
        for _ in 0..16 {
            w.record(Duration::from_micros(10), FOUND);
        }
        assert!(w.worth_spinning(), "batches 10 µs apart again: poll");
    }

    /// Waits that sleep at once after a poll that ended with `end`.
    fn backed_off(w: &mut SpinWait, end: Polled<()>) -> u32 {
        w.record(Duration::from_micros(5), Some(&end));
        let mut waits = 0;
        while !w.worth_spinning() {
            w.record(Duration::from_micros(5), None::<&Polled<()>>);
            waits += 1;
            assert!(waits <= BACK_OFF_MOST, "the back-off ends");
        }
        waits
    }

    #[test]
    fn polls_that_miss_or_lose_their_cpu_back_off_longer_each_time() {
        let mut w = SpinWait::default();
        let mut got = Vec::new();
        for end in [Polled::Missed, Polled::Preempted]
            .into_iter()
            .cycle()
            .take(9)
        {
            got.push(backed_off(&mut w, end));
        }
        assert_eq!(got, [16, 32, 64, 128, 256, 512, 1024, 1024, 1024]);
        // A run of polls that find their batch starts the back-off over ...
        for _ in 0..CLEAN_POLLS {
            w.record(Duration::from_micros(5), FOUND);
        }
        assert_eq!(backed_off(&mut w, Polled::Preempted), BACK_OFF_FIRST);
        // ... but a shorter run does not.
        for _ in 0..CLEAN_POLLS - 1 {
            w.record(Duration::from_micros(5), FOUND);
        }
        assert_eq!(backed_off(&mut w, Polled::Missed), 2 * BACK_OFF_FIRST);
        // Waits that find their batch by polling never start a back-off.
        let mut w = SpinWait::default();
        for _ in 0..10 * CLEAN_POLLS {
            w.record(Duration::from_micros(5), FOUND);
            assert!(w.worth_spinning());
        }
    }

    #[test]
    fn spin_returns_what_the_poll_finds_or_gives_up_after_the_budget() {
        let mut n = 0;
        let got = SpinWait::spin(Instant::now(), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(got, Polled::Found(3));
        // Nothing found: the budget runs out, unless this thread loses its CPU first.
        let start = Instant::now();
        let none = SpinWait::spin(start, || None::<()>);
        assert!(matches!(none, Polled::Missed | Polled::Preempted));
        if none == Polled::Missed {
            assert!(start.elapsed() >= SPIN_MAX);
        }
    }

    #[test]
    fn a_gap_between_two_looks_is_taken_for_a_lost_cpu() {
        let mut first = true;
        let got = SpinWait::spin(Instant::now(), || {
            if !std::mem::take(&mut first) {
                panic!("the poll after the gap ends the spin");
            }
            std::thread::sleep(PREEMPTED_GAP * 2);
            None::<()>
        });
        assert_eq!(got, Polled::Preempted);
    }

    #[test]
    fn yielding_polls_find_what_another_thread_sends_and_never_count_a_lost_cpu() {
        // A value sent from another thread is found between yields.
        let (tx, rx) = crossbeam_channel::unbounded();
        let got = std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::yield_now();
                tx.send(7u32).expect("the receiver is alive");
            });
            // The budget may run out before the sender runs on a busy machine: look again.
            let mut got = Polled::Missed;
            while got == Polled::Missed {
                got = SpinWait::yield_between(Instant::now(), || rx.try_recv().ok());
            }
            got
        });
        assert_eq!(got, Polled::Found(7));
        // Nothing arrives: the budget runs out (a look after a long gap, which a busy poll
        // takes for a lost CPU, is just another look here).
        let start = Instant::now();
        let mut first = true;
        let none = SpinWait::yield_between(start, || {
            if std::mem::take(&mut first) {
                std::thread::sleep(PREEMPTED_GAP * 2);
            }
            None::<()>
        });
        assert_eq!(none, Polled::Missed);
        assert!(start.elapsed() >= SPIN_MAX);
    }
}
