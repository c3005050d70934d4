//! The resident-set breakdown the operating system reports for this process.
//!
//! On Linux, `/proc/self/status` gives `VmRSS = RssAnon + RssFile + RssShmem` and the high-water
//! marks `VmHWM` (peak resident) and `VmPeak` (peak virtual size). A memory-mapped data set shows
//! up as `RssFile` (page cache), owned buffers as `RssAnon`. The kernel updates these counters
//! asynchronously, so they can lag the truth by a few pages.
//!
//! On other systems [`read`] returns [`RssError::Unavailable`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where the status is read from.
pub const STATUS_PATH: &str = "/proc/self/status";
/// Where the process's fault and scheduling counters are read from.
pub const STAT_PATH: &str = "/proc/self/stat";
/// Where the high-water mark is reset.
pub const CLEAR_REFS_PATH: &str = "/proc/self/clear_refs";

/// The memory lines of `/proc/self/status`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcStatus {
    /// Resident set size (`VmRSS`).
    pub vm_rss: u64,
    /// Resident anonymous memory (`RssAnon`): heap, stacks, owned buffers.
    pub rss_anon: u64,
    /// Resident file mappings (`RssFile`): mapped data sets, binaries.
    pub rss_file: u64,
    /// Resident shared memory (`RssShmem`): SysV shm, tmpfs mappings, shared anonymous maps.
    pub rss_shmem: u64,
    /// Peak resident set size (`VmHWM`), since start or the last [`reset_peak`].
    pub vm_hwm: u64,
    /// Peak virtual size (`VmPeak`).
    pub vm_peak: u64,
}

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RssError {
    /// The file could not be read (not Linux, or /proc not mounted).
    #[error("cannot read {path} (the /proc RSS breakdown exists only on Linux): {source}")]
    Unavailable {
        /// The file that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A field is absent (kernels before 4.5 lack RssAnon/RssFile/RssShmem).
    #[error("field {field} missing from {STATUS_PATH} (needs Linux 4.5 or later)")]
    Missing {
        /// The field name.
        field: &'static str,
    },
    /// A field's value is not `<number> kB`.
    #[error("cannot parse {field} in {STATUS_PATH}: {line:?}")]
    Parse {
        /// The field name.
        field: &'static str,
        /// The offending line.
        line: String,
    },
    /// A `stat` line without a minor-fault count (its field 10).
    #[error("no minor-fault count (field 10) in {STAT_PATH}: {line:?}")]
    Stat {
        /// The line read.
        line: String,
    },
    /// The high-water mark could not be reset.
    #[error("cannot reset VmHWM through {path}: {source}")]
    Reset {
        /// The file that failed.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

const FIELDS: [&str; 6] = ["VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "VmPeak"];

/// Parses the text of a `/proc/<pid>/status` file.
pub fn parse(text: &str) -> Result<ProcStatus, RssError> {
    let mut values: [Option<u64>; 6] = [None; 6];
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(slot) = FIELDS.iter().position(|f| *f == key) else {
            continue;
        };
        let field = FIELDS[slot];
        let bad = || RssError::Parse {
            field,
            line: line.to_string(),
        };
        let mut parts = rest.split_whitespace();
        let number: u64 = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let multiplier = match parts.next() {
            Some("kB") => 1024,
            None => 1,
            Some(_) => return Err(bad()),
        };
        values[slot] = Some(number.checked_mul(multiplier).ok_or_else(bad)?);
    }
    let get = |i: usize| values[i].ok_or(RssError::Missing { field: FIELDS[i] });
    Ok(ProcStatus {
        vm_rss: get(0)?,
        rss_anon: get(1)?,
        rss_file: get(2)?,
        rss_shmem: get(3)?,
        vm_hwm: get(4)?,
        vm_peak: get(5)?,
    })
}

/// Reads `/proc/self/status`.
pub fn read() -> Result<ProcStatus, RssError> {
    let text = std::fs::read_to_string(STATUS_PATH).map_err(|source| RssError::Unavailable {
        path: PathBuf::from(STATUS_PATH),
        source,
    })?;
    parse(&text)
}

/// Minor page faults of this process so far, all its threads (field 10 of
/// `/proc/self/stat`): pages it touched for the first time, or again after giving them back.
pub fn minor_faults() -> Result<u64, RssError> {
    let text = std::fs::read_to_string(STAT_PATH).map_err(|source| RssError::Unavailable {
        path: PathBuf::from(STAT_PATH),
        source,
    })?;
    parse_minor_faults(&text)
}

/// The minor-fault count (field 10) of a `/proc/PID/stat` line. The command name (field 2) is
/// in parentheses and may itself hold spaces and parentheses, so the fields are counted after
/// its last `)`.
pub fn parse_minor_faults(stat: &str) -> Result<u64, RssError> {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(7))
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| RssError::Stat {
            line: stat.trim_end().to_string(),
        })
}

/// Resets `VmHWM` to the current resident size by writing `5` to `/proc/self/clear_refs`
/// (Linux 4.0 and later). It fails where /proc is read-only or absent (some sandboxes and
/// containers); the peak then keeps counting from the process start, and callers should report
/// that rather than trust a per-phase peak.
pub fn reset_peak() -> Result<(), RssError> {
    reset_peak_through(Path::new(CLEAR_REFS_PATH))
}

/// Writes `5` to `path` (the `clear_refs` file), naming `path` in the error.
fn reset_peak_through(path: &Path) -> Result<(), RssError> {
    std::fs::write(path, b"5").map_err(|source| RssError::Reset {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_faults_are_field_ten_whatever_the_command_name() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 7321 0 0 0 12 3 0 0 20 0 1 0\n";
        assert_eq!(parse_minor_faults(line).ok(), Some(7321));
        assert!(matches!(
            parse_minor_faults("4242 (cat) S 1"),
            Err(RssError::Stat { .. })
        ));
        assert!(matches!(
            parse_minor_faults("no parenthesis"),
            Err(RssError::Stat { .. })
        ));
        #[cfg(target_os = "linux")]
        {
            let before = minor_faults().expect("/proc/self/stat");
            let touched = vec![1u8; 16 << 20];
            std::hint::black_box(&touched);
            assert!(minor_faults().expect("/proc/self/stat") >= before);
        }
    }

    const SAMPLE: &str = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\nVmPeak:\t    8396 kB\n\
VmSize:\t    8396 kB\nVmLck:\t       0 kB\nVmHWM:\t    1024 kB\nVmRSS:\t    1000 kB\n\
RssAnon:\t      96 kB\nRssFile:\t     900 kB\nRssShmem:\t       4 kB\nVmData:\t     360 kB\n\
Threads:\t1\n";

    #[test]
    fn parses_sample_text_in_bytes() {
        let s = parse(SAMPLE).expect("parses");
        assert_eq!(
            s,
            ProcStatus {
                vm_rss: 1000 * 1024,
                rss_anon: 96 * 1024,
                rss_file: 900 * 1024,
                rss_shmem: 4 * 1024,
                vm_hwm: 1024 * 1024,
                vm_peak: 8396 * 1024,
            }
        );
        assert_eq!(s.vm_rss, s.rss_anon + s.rss_file + s.rss_shmem);
    }

    #[test]
    fn missing_and_garbled_fields_are_errors() {
        let without = SAMPLE.replace("RssFile", "RssXile");
        assert!(matches!(
            parse(&without),
            Err(RssError::Missing { field: "RssFile" })
        ));
        let garbled = SAMPLE.replace("RssAnon:\t      96 kB", "RssAnon:\t lots kB");
        let err = parse(&garbled).expect_err("garbled");
        assert!(matches!(
            err,
            RssError::Parse {
                field: "RssAnon",
                ..
            }
        ));
        assert!(err.to_string().contains("RssAnon"));
        let unit = SAMPLE.replace("RssAnon:\t      96 kB", "RssAnon:\t 96 MB");
        assert!(parse(&unit).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process_and_sees_anonymous_growth() {
        let before = read().expect("linux /proc");
        assert!(before.vm_rss > 0 && before.vm_hwm >= before.vm_rss);
        // Touch 64 MiB of fresh anonymous memory: RssAnon must grow by most of it.
        let block = vec![1u8; 64 << 20];
        let after = read().expect("linux /proc");
        assert!(
            after.rss_anon >= before.rss_anon + (48 << 20),
            "{before:?} -> {after:?}"
        );
        drop(std::hint::black_box(block));
    }

    /// The documented failure, forced on every machine: a `clear_refs` that cannot be written
    /// is a [`RssError::Reset`] naming the file and carrying the I/O error. (Whether the real
    /// reset works, and that it lowers `VmHWM`, is checked in `tests/rss_peak.rs`, in a process
    /// of its own so no other test's memory moves the peak.)
    #[test]
    fn a_clear_refs_that_cannot_be_written_is_a_reset_error() {
        let dir = std::env::temp_dir().join(format!("trainmem-probe-rss-{}", std::process::id()));
        let missing = dir.join("no-such-dir").join("clear_refs");
        let err = reset_peak_through(&missing).expect_err("the file's directory does not exist");
        match &err {
            RssError::Reset { path, source } => {
                assert_eq!(path, &missing);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected RssError::Reset, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.starts_with("cannot reset VmHWM through "), "{msg}");
        assert!(msg.contains("no-such-dir/clear_refs"), "{msg}");
    }

    /// The happy path of the same helper writes exactly `5`, the `clear_refs` value that resets
    /// only the high-water mark (1-4 would clear the referenced/soft-dirty bits instead).
    #[test]
    fn reset_writes_5() {
        let dir = std::env::temp_dir().join(format!("trainmem-probe-rss5-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("clear_refs");
        reset_peak_through(&file).expect("a writable file");
        assert_eq!(std::fs::read(&file).unwrap(), b"5");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
