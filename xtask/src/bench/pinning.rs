//! Pinning threads to CPUs, so that a loader's workers and the copy bound they are compared
//! with run on the same CPUs (Linux; elsewhere nothing is pinned).
//!
//! On the virtual machines these benches run on, one vCPU can copy up to 1.75× faster than
//! another at the same moment, and which one is faster changes from second to second
//! (RESULTS.md, "Token windows and Arrow: `bench loader-formats`"). A row whose bound ran
//! on one CPU while the workers built on another measures that lottery as much as the loader.
//! So the loader-formats bench pins worker `j` and the bound's thread `j` to the same CPU.

use std::collections::BTreeSet;

/// The CPUs the calling thread may run on (a thread starts with its creator's, so the main
/// thread's are the process's), in order; empty where that cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        let Some(set) = current_set() else {
            return Vec::new();
        };
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `c < CPU_SETSIZE`, inside the set.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    Vec::new()
}

#[cfg(target_os = "linux")]
fn empty_set() -> libc::cpu_set_t {
    // SAFETY: `cpu_set_t` is a plain bit array, for which all zeroes is the empty set.
    unsafe { std::mem::zeroed() }
}

/// The calling thread's CPU set, or `None` if it cannot be read.
#[cfg(target_os = "linux")]
fn current_set() -> Option<libc::cpu_set_t> {
    let mut set = empty_set();
    // SAFETY: `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into the live
    // `set`; pid 0 is the calling thread.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    (rc == 0).then_some(set)
}

#[cfg(target_os = "linux")]
fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) -> bool {
    // SAFETY: `set` is a live `cpu_set_t` of the size passed; the call only reads it. A `tid`
    // that names no thread of this process makes the call fail, nothing else.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
}

/// Pins thread `tid` of this process (0: the calling thread) to `cpu`; whether it worked.
pub fn pin(tid: i32, cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let mut set = empty_set();
        // SAFETY: `cpu < CPU_SETSIZE`, inside the set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        set_affinity(tid, &set)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (tid, cpu);
        false
    }
}

/// The calling thread pinned to one CPU until the guard is dropped, which gives it back the
/// CPUs it had (the bound may run on the caller's own thread, which must not stay pinned).
pub struct Pinned {
    #[cfg(target_os = "linux")]
    before: Option<libc::cpu_set_t>,
}

impl Pinned {
    /// Pins the calling thread to `cpu` (nothing when `cpu` is `None` or pinning fails).
    pub fn to(cpu: Option<usize>) -> Pinned {
        #[cfg(target_os = "linux")]
        {
            let Some(cpu) = cpu else {
                return Pinned { before: None };
            };
            Pinned {
                before: current_set().filter(|_| pin(0, cpu)),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = cpu;
            Pinned {}
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(before) = &self.before {
            set_affinity(0, before);
        }
    }
}

/// The thread ids of this process whose name starts with `prefix` (Linux names are cut to 15
/// bytes: trainmem-loader's workers all read `trainmem-loader`).
pub fn threads_named(prefix: &str) -> BTreeSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return BTreeSet::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            comm.starts_with(prefix).then_some(tid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn a_thread_pinned_runs_on_its_cpu_and_gets_its_cpus_back() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let last = *cpus.last().expect("one CPU at least");
        std::thread::spawn(move || {
            let mine = allowed_cpus();
            {
                let _pin = Pinned::to(Some(last));
                assert_eq!(allowed_cpus(), vec![last]);
                assert_eq!(trainmem_loader::current_cpu(), Some(last));
            }
            assert_eq!(allowed_cpus(), mine);
            let _none = Pinned::to(None);
            assert_eq!(allowed_cpus(), mine);
        })
        .join()
        .expect("the pinned thread");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn named_threads_are_found_and_pinned() {
        let first = *allowed_cpus().first().expect("one CPU at least");
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::Builder::new()
            .name("pin (t) w".into())
            .spawn(move || {
                let _pin = Pinned::to(Some(first));
                tx.send(()).expect("send");
                done_rx.recv().ok();
            })
            .expect("spawn");
        rx.recv().expect("started");
        let found = threads_named("pin (t)");
        assert_eq!(found.len(), 1, "{found:?}");
        let tid = *found.first().expect("one");
        assert!(pin(tid, first));
        assert!(!pin(tid, usize::MAX));
        done_tx.send(()).expect("done");
        h.join().expect("join");
        assert!(threads_named("pin (t)").is_empty());
        assert!(!pin(-1, first), "no such thread");
    }
}
