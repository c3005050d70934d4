//! A child memory cgroup (cgroup v1) for the loader bench's streaming run under a memory limit:
//! created under this process's own memory cgroup, with `memory.limit_in_bytes` set, joined by
//! the streaming child process, read back (peak usage, failures, page-ins) and removed on drop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

/// How to run the streaming check without this facility.
const WITHOUT: &str = "run `bench loader` without --stream-under-limit for the streaming check \
     without a memory limit, or run it as root on a host with a cgroup v1 memory controller";

/// A memory cgroup created by this process; removed (rmdir) when dropped.
#[derive(Debug)]
pub struct MemCgroup {
    dir: PathBuf,
}

/// The effective uid from `/proc/self/status`.
fn effective_uid() -> anyhow::Result<u32> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|e| e.parse().ok())
        .context("no effective uid in /proc/self/status")
}

/// The directory of this process's cgroup v1 memory cgroup, from `/proc/self/cgroup` (the
/// path) and `/proc/self/mountinfo` (where the memory hierarchy is mounted, and its root).
fn own_memory_cgroup() -> anyhow::Result<PathBuf> {
    let cgroups =
        std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let path = cgroups
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_id, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .with_context(|| {
            format!("no cgroup v1 memory controller in /proc/self/cgroup (cgroup v2 only, or none); {WITHOUT}")
        })?;
    let mounts =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    for line in mounts.lines() {
        // `id parent dev root mountpoint options [optional...] - fstype source superoptions`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split_whitespace();
        let (fstype, _source, superopts) = (r.next(), r.next(), r.next().unwrap_or(""));
        if fstype != Some("cgroup") || !superopts.split(',').any(|o| o == "memory") {
            continue;
        }
        let l: Vec<&str> = left.split_whitespace().collect();
        let (Some(root), Some(mountpoint)) = (l.get(3), l.get(4)) else {
            continue;
        };
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .trim_start_matches('/');
        return Ok(Path::new(mountpoint).join(rel));
    }
    bail!(
        "the cgroup v1 memory hierarchy is not mounted (no `cgroup` mount with the memory option in /proc/self/mountinfo); {WITHOUT}"
    )
}

/// Checks that a child memory cgroup can be made here (root, a mounted cgroup v1 memory
/// controller) and returns this process's memory cgroup directory, the future parent.
pub fn preflight() -> anyhow::Result<PathBuf> {
    let uid = effective_uid()?;
    if uid != 0 {
        bail!(
            "--stream-under-limit creates a memory cgroup and needs root (effective uid is {uid}); {WITHOUT}"
        );
    }
    let dir = own_memory_cgroup()?;
    anyhow::ensure!(
        dir.join("memory.limit_in_bytes").exists(),
        "{} has no memory.limit_in_bytes (not a cgroup v1 memory cgroup); {WITHOUT}",
        dir.display()
    );
    Ok(dir)
}

impl MemCgroup {
    /// Creates `name` under this process's memory cgroup with `memory.limit_in_bytes = limit`.
    /// Fails with what is missing (root, a cgroup v1 memory controller, write access) and how
    /// to run without it.
    pub fn create(name: &str, limit: u64) -> anyhow::Result<MemCgroup> {
        let parent = preflight()?;
        let dir = parent.join(name);
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "cannot create the memory cgroup {}; {WITHOUT}",
                dir.display()
            )
        })?;
        let cg = MemCgroup { dir };
        cg.write("memory.limit_in_bytes", &limit.to_string())?;
        Ok(cg)
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        let p = self.dir.join(file);
        std::fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
    }

    /// A single-number control file (`memory.max_usage_in_bytes`, `memory.failcnt`, ...).
    pub fn read_u64(&self, file: &str) -> anyhow::Result<u64> {
        read_u64(&self.dir.join(file))
    }

    /// `memory.stat` as name → value.
    pub fn stat(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        let p = self.dir.join("memory.stat");
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The child has exited, but its exit may still be in flight for a moment: retry.
        // Page cache still charged here moves to the parent cgroup on rmdir.
        for _ in 0..40 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        eprintln!(
            "warning: could not remove the memory cgroup {} (rmdir it by hand)",
            self.dir.display()
        );
    }
}

fn read_u64(p: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("{} is not a number: {text:?}", p.display()))
}

/// Moves the calling process (all its threads) into the memory cgroup at `dir`, and checks
/// that `/proc/self/cgroup` then names it. Memory charged before the move stays charged where
/// it was; everything the process touches afterwards is charged to `dir`.
pub fn join(dir: &Path) -> anyhow::Result<()> {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .with_context(|| format!("writing this process's id to {}", procs.display()))?;
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("cgroup directory without a name")?;
    let now = own_memory_cgroup()?;
    anyhow::ensure!(
        now.file_name().and_then(|n| n.to_str()) == Some(name),
        "after joining {}, /proc/self/cgroup still puts this process in {}",
        dir.display(),
        now.display()
    );
    Ok(())
}

/// Parses a memory limit with trainmem-core's one unit rule (`KiB`, `MiB`, `GiB` are powers
/// of 2; `KB`, `MB`, `GB` powers of 10), e.g. `1GiB`, `512MiB`, `1073741824`; at least 4 KiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bytes = trainmem_core::bytes::parse_bytes(s)?;
    if bytes < 4096 {
        return Err(format!(
            "{s:?} is too small for a memory limit (at least 4 KiB)"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000), "GB is a power of 10");
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("10").is_err());
    }
}
