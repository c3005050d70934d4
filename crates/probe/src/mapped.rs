//! Resident bytes of particular memory-mapped files: the share of `RssFile` that one data set's
//! mappings hold.
//!
//! `RssFile` counts every file page mapped into the process: the binary, its shared libraries,
//! and, on a GPU, the driver's and the CUDA libraries' files, which map themselves in as a run
//! goes. The page cache a memory-mapped data set brings in is one part of it. On Linux,
//! `/proc/self/smaps` lists every mapping with its own `Rss:` line; summing the mappings of the
//! data set's files gives that part alone.

use std::path::{Path, PathBuf};

use crate::RssError;

/// Where the per-mapping figures are read from.
pub const SMAPS_PATH: &str = "/proc/self/smaps";

/// Resident bytes of this process's mappings of `files` (each mapping's `Rss:`, summed), read
/// from `/proc/self/smaps`. Files are matched by their canonical path; a file that cannot be
/// resolved, or is not mapped, contributes 0.
pub fn mapped_rss(files: &[PathBuf]) -> Result<u64, RssError> {
    let wanted: Vec<String> = files
        .iter()
        .filter_map(|f| f.canonicalize().ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if wanted.is_empty() {
        return Ok(0);
    }
    let text = std::fs::read_to_string(SMAPS_PATH).map_err(|source| RssError::Unavailable {
        path: PathBuf::from(SMAPS_PATH),
        source,
    })?;
    parse_mapped_rss(&text, &wanted)
}

/// The pathname of an smaps mapping header (`start-end perms offset dev inode [pathname]`), or
/// `None` when `line` is not a header. The pathname may hold spaces.
fn header_path(line: &str) -> Option<&str> {
    let (range, _) = line.split_once(' ')?;
    let (start, end) = range.split_once('-')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !(hex(start) && hex(end)) {
        return None;
    }
    // Skip the four fields after the range; what is left (trimmed) is the pathname.
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = rest.split_once(' ').map_or("", |(_, r)| r);
    }
    Some(rest.trim())
}

/// Sums the `Rss:` of every mapping in smaps `text` whose pathname is one of `paths`.
pub fn parse_mapped_rss(text: &str, paths: &[impl AsRef<Path>]) -> Result<u64, RssError> {
    let mut total = 0u64;
    let mut inside = false;
    for line in text.lines() {
        if let Some(path) = header_path(line) {
            inside = paths.iter().any(|p| Path::new(path) == p.as_ref());
            continue;
        }
        if !inside {
            continue;
        }
        let Some(rest) = line.strip_prefix("Rss:") else {
            continue;
        };
        let bad = || RssError::Parse {
            field: "Rss",
            line: line.to_string(),
        };
        let mut parts = rest.split_whitespace();
        let kb: u64 = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if parts.next() != Some("kB") {
            return Err(bad());
        }
        total += kb.checked_mul(1024).ok_or_else(bad)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
5581a000-5581b000 r--p 00000000 08:01 131 /usr/bin/trainmem
Size:                  4 kB
Rss:                   4 kB
7f00a000-7f40a000 r--s 00000000 08:01 77 /data/run one/features.npy
Size:              65536 kB
Rss:                1200 kB
Pss:                1200 kB
VmFlags: rd sh mr mw me ms sd
7f40a000-7f40b000 r--s 00000000 08:01 78 /data/run one/labels.npy
Size:                  4 kB
Rss:                   4 kB
7f50a000-7f60a000 rw-p 00000000 00:00 0
Size:              16384 kB
Rss:                 800 kB
7f60a000-7f60b000 r--s 00001000 08:01 77 /data/run one/features.npy
Rss:                  16 kB
";

    #[test]
    fn sums_every_mapping_of_the_files_asked_for() {
        let files = ["/data/run one/features.npy", "/data/run one/labels.npy"];
        assert_eq!(
            parse_mapped_rss(SAMPLE, &files).expect("parses"),
            (1200 + 4 + 16) * 1024
        );
        let one = ["/data/run one/labels.npy"];
        assert_eq!(parse_mapped_rss(SAMPLE, &one).expect("parses"), 4 * 1024);
        let none = ["/elsewhere.npy"];
        assert_eq!(parse_mapped_rss(SAMPLE, &none).expect("parses"), 0);
    }

    #[test]
    fn headers_are_told_from_fields() {
        assert_eq!(
            header_path("7f00-7f40 r--s 00000000 08:01 77 /a b/c.npy"),
            Some("/a b/c.npy")
        );
        assert_eq!(header_path("7f50-7f60 rw-p 00000000 00:00 0"), Some(""));
        assert_eq!(header_path("Rss:                 800 kB"), None);
        assert_eq!(header_path("VmFlags: rd sh mr"), None);
    }

    #[test]
    fn a_garbled_rss_line_is_an_error() {
        let text = "7f00-7f40 r--s 00000000 08:01 77 /d.npy\nRss: many kB\n";
        assert!(parse_mapped_rss(text, &["/d.npy"]).is_err());
    }

    #[test]
    fn a_mapped_file_of_this_process_is_seen() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("trainmem-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("data.bin");
        let mut f = std::fs::File::create(&path).expect("create");
        f.write_all(&vec![7u8; 1 << 20]).expect("write");
        drop(f);
        let file = std::fs::File::open(&path).expect("open");
        // SAFETY: the file is private to this test and not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("map");
        let files = [path.clone()];
        let before = mapped_rss(&files).expect("smaps readable on Linux");
        let sum: u64 = map.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 7 * 256);
        let after = mapped_rss(&files).expect("smaps readable on Linux");
        assert!(
            after >= (1 << 20) && after >= before,
            "touching every page of a 1 MiB mapping makes it resident: {before} -> {after}"
        );
        drop(map);
        assert_eq!(mapped_rss(&files).expect("readable"), 0, "unmapped");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
