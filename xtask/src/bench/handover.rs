//! The cost of one hand-over between two threads that share a CPU, measured the way a loader's
//! caller and a worker meet when the workers fill every CPU.
//!
//! With as many workers as CPUs or more, no CPU is free for the caller: every batch a worker
//! finishes has to be taken by a caller that shares a CPU with some worker. The worker sends
//! the batch and yields its CPU; the caller, which looks for its batch between yields of its
//! own, takes it, sends the next task and yields again, and the CPU goes back to the worker.
//! That is two context switches per batch that the copy bound never pays. [`round_trip`] times
//! that exchange as trainmem-loader makes it (crossbeam channels; the caller looks with
//! `try_recv` between yields, the worker takes its task with a blocking receive and yields
//! after each send) with both threads pinned to one CPU and nothing else to do, so the
//! loader-formats bench can print it beside the build times of its rows: the part of a batch's
//! time that no change inside a build can win back on that machine.

use std::time::{Duration, Instant};

use super::pinning::Pinned;

/// The mean time of one hand-over round trip over `trips` of them: the calling thread sends a
/// task and waits for its result, another thread receives the task, sends it back and yields,
/// both on `cpu` when it is given and pinning works (otherwise where the scheduler puts them).
pub fn round_trip(cpu: Option<usize>, trips: usize) -> Duration {
    let trips = trips.max(1);
    let (task_tx, task_rx) = crossbeam_channel::unbounded::<usize>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<usize>();
    std::thread::scope(|s| {
        s.spawn(move || {
            let _pin = Pinned::to(cpu);
            for t in task_rx.iter() {
                if done_tx.send(t).is_err() {
                    break;
                }
                std::thread::yield_now();
            }
        });
        let _pin = Pinned::to(cpu);
        // One untimed trip: the other thread has started and is waiting.
        let _ = task_tx.send(usize::MAX);
        let _ = done_rx.recv();
        let started = Instant::now();
        for t in 0..trips {
            if task_tx.send(t).is_err() {
                break;
            }
            let back = loop {
                match done_rx.try_recv() {
                    Ok(b) => break Some(b),
                    Err(crossbeam_channel::TryRecvError::Empty) => std::thread::yield_now(),
                    Err(crossbeam_channel::TryRecvError::Disconnected) => break None,
                }
            };
            if back != Some(t) {
                break;
            }
        }
        let took = started.elapsed();
        drop(task_tx);
        took / u32::try_from(trips).unwrap_or(u32::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_takes_time_and_returns() {
        let cpu = super::super::pinning::allowed_cpus().first().copied();
        let t = round_trip(cpu, 2_000);
        assert!(t > Duration::ZERO, "a round trip is not free: {t:?}");
        // Two context switches and four channel operations take microseconds; even on a CPU
        // shared with busy threads (other tests) each side runs within a time slice of a few
        // milliseconds. A mean of 50 ms would be an exchange that stalls.
        assert!(
            t < Duration::from_millis(50),
            "a round trip took {t:?}: the exchange stalled"
        );
        assert!(round_trip(None, 0) > Duration::ZERO, "zero trips run one");
    }
}
