//! Dropping a file's pages from the OS page cache, so that the next read of a memory-mapped
//! data set comes from disk (a cold-cache measurement, or a streaming run whose page cache must
//! be charged to the reader's memory cgroup rather than to whoever cached the file before); and
//! reading a file back into the page cache in 2 MiB pages where the kernel can
//! ([`read_in_huge_pages`]).

use std::fs::File;
use std::io;
use std::path::Path;

/// Asks the kernel to drop `path`'s clean pages from the page cache (`posix_fadvise` with
/// `POSIX_FADV_DONTNEED` over the whole file), after writing back its dirty pages
/// (`fsync`) so that they can be dropped too.
///
/// Advisory: pages that some process has mapped and is using may stay resident, and nothing
/// is dropped on platforms other than Linux (the call then only syncs). Errors name nothing
/// but the OS error; callers add the path.
pub fn evict_page_cache(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    file.sync_all()?;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `posix_fadvise` takes a file descriptor and three integers and touches no
        // memory of ours; `file` keeps the descriptor open for the duration of the call.
        // Tested by `tests::evicting_drops_resident_pages_and_keeps_contents`.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

/// How a file sits in this process's mappings: resident kilobytes, and how many of them the
/// kernel maps with 2 MiB page-table entries (`Rss` and `FilePmdMapped` in
/// `/proc/self/smaps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MappedPages {
    /// Kilobytes of the file's mappings that are resident.
    pub resident_kib: u64,
    /// Kilobytes of those mapped in 2 MiB pages.
    pub huge_kib: u64,
}

impl MappedPages {
    /// The share of the resident bytes mapped in 2 MiB pages, 0 when nothing is resident.
    pub fn huge_share(&self) -> f64 {
        if self.resident_kib == 0 {
            0.0
        } else {
            self.huge_kib as f64 / self.resident_kib as f64
        }
    }
}

/// Sums `Rss` and `FilePmdMapped` over the mappings of `path` in `smaps` (the text of a
/// `/proc/PID/smaps`); `path` is compared with each mapping's path name as written there.
pub fn mapped_pages_in(smaps: &str, path: &Path) -> MappedPages {
    let name = path.to_string_lossy();
    let mut pages = MappedPages::default();
    let mut inside = false;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if !first.ends_with(':') {
            inside = header_path(line) == Some(&*name);
        } else if inside {
            let kib = words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            match first {
                "Rss:" => pages.resident_kib += kib,
                "FilePmdMapped:" => pages.huge_kib += kib,
                _ => {}
            }
        }
    }
    pages
}

/// The path name of a mapping's header line in `smaps` (range, permissions, offset, device,
/// inode, then the path name, which may hold spaces); `None` when the line has fewer fields,
/// `Some("")` for a mapping without a name.
fn header_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        if rest.is_empty() {
            return None;
        }
        rest = &rest[rest.find(char::is_whitespace).unwrap_or(rest.len())..];
    }
    Some(rest.trim_start())
}

/// How `path` (made absolute) is mapped in this process right now; `None` where there is no
/// `/proc/self/smaps` (other platforms).
pub fn mapped_pages(path: &Path) -> Option<MappedPages> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Some(mapped_pages_in(&smaps, &abs))
}

/// Drops `path` from the page cache ([`evict_page_cache`]) and reads it back through a mapping
/// advised `MADV_HUGEPAGE`, so that where the kernel and the file system support large folios
/// (ext4 and XFS on recent Linux kernels, tmpfs mounted with `huge=`) the page cache holds the
/// file in 2 MiB folios, which later mappings of it (the loader's) map with 2 MiB page-table
/// entries. Shuffled samples read through 4 KiB pages each cost a page walk (a TLB miss);
/// through 2 MiB pages almost none do. Returns how the file was mapped right after the read,
/// before the mapping was dropped.
///
/// For data sets that fit in memory, read before training: the whole file is read. Pages that
/// another process has mapped cannot be dropped and stay as they were. Elsewhere than Linux the
/// file is only read.
pub fn read_in_huge_pages(path: &Path) -> io::Result<MappedPages> {
    evict_page_cache(path)?;
    let file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(MappedPages::default());
    }
    // SAFETY: the mapping is read-only and private to this function; a concurrent truncation
    // of the file by another process could fault a read (as for any mapped data set), which
    // the loader's docs state for every memory-mapped format.
    let map = unsafe { memmap2::Mmap::map(&file) }?;
    #[cfg(target_os = "linux")]
    {
        // A hint: a kernel without it leaves the pages as they come.
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    let mut sum = 0u8;
    for off in (0..map.len()).step_by(4096) {
        sum = sum.wrapping_add(map[off]);
    }
    std::hint::black_box(sum);
    Ok(mapped_pages(path).unwrap_or(MappedPages {
        resident_kib: map.len().div_ceil(1024) as u64,
        huge_kib: 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_pages_sum_the_named_files_mappings_only() {
        let smaps = "\
7f0000000000-7f0000400000 r--s 00000000 fe:00 42                         /data/a.bin
Size:               4096 kB
Rss:                4096 kB
FilePmdMapped:      2048 kB
VmFlags: rd mr me ms
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 
Rss:                1024 kB
FilePmdMapped:         0 kB
7f0000600000-7f0000800000 r--s 00400000 fe:00 42                         /data/a.bin
Rss:                 512 kB
FilePmdMapped:         0 kB
7f0000800000-7f0000a00000 r--s 00000000 fe:00 43                         /data/a.bin.old
Rss:                2048 kB
FilePmdMapped:      2048 kB
";
        let a = mapped_pages_in(smaps, Path::new("/data/a.bin"));
        assert_eq!(
            a,
            MappedPages {
                resident_kib: 4608,
                huge_kib: 2048
            }
        );
        assert!((a.huge_share() - 2048.0 / 4608.0).abs() < 1e-12);
        let spaced = "\
7f0000000000-7f0000200000 r--s 00000000 fe:00 44                         /data/my runs/a.bin
Rss:                2048 kB
FilePmdMapped:      2048 kB
7f0000200000-7f0000300000 r--s 00000000 fe:00 45                         /data/my
Rss:                1024 kB
";
        assert_eq!(
            mapped_pages_in(spaced, Path::new("/data/my runs/a.bin")),
            MappedPages {
                resident_kib: 2048,
                huge_kib: 2048
            },
            "a path name with a space is matched whole"
        );
        assert_eq!(
            mapped_pages_in(spaced, Path::new("/data/my")).resident_kib,
            1024,
            "and not by its first word"
        );
        assert_eq!(header_path("7f00-7f01 rw-p 00000000 00:00 0 "), Some(""));
        assert_eq!(header_path("7f00-7f01 rw-p 00000000"), None);
        let none = mapped_pages_in(smaps, Path::new("/data/b.bin"));
        assert_eq!(none, MappedPages::default());
        assert_eq!(none.huge_share(), 0.0);
    }

    #[test]
    fn reading_in_huge_pages_reads_the_whole_file_and_keeps_it() {
        let dir = std::env::temp_dir().join(format!("trainmem-huge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        let bytes: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let pages = read_in_huge_pages(&path).unwrap();
        eprintln!("6 MiB file: {pages:?}");
        // Every page was read through the mapping (barring reclaim in the moment between).
        assert!(pages.resident_kib >= 5 * 1024, "{pages:?}");
        assert!(pages.huge_kib <= pages.resident_kib, "{pages:?}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        // Nothing of the mapping is left in this process.
        #[cfg(target_os = "linux")]
        assert_eq!(mapped_pages(&path), Some(MappedPages::default()));
        let empty = dir.join("empty.bin");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(read_in_huge_pages(&empty).unwrap(), MappedPages::default());
        let missing = read_in_huge_pages(&dir.join("missing.bin")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Pages of `path` in the page cache, and the file's page count, read with `mincore` over
    /// a shared read-only mapping of the file. The mapping is never touched, so it maps no page
    /// itself (a mapped page could not be evicted); for a file mapping `mincore` reports the
    /// file's page-cache residency. (Linux answers for files the caller owns or may write,
    /// which holds for the test's own file.)
    #[cfg(target_os = "linux")]
    fn resident_pages(path: &Path) -> (usize, usize) {
        let file = File::open(path).unwrap();
        // SAFETY: the file lives in this test's own directory and nothing writes or truncates
        // it while the mapping exists (the mapping is dropped at the end of this function); no
        // byte of the mapping is read either, only its address is passed to `mincore`.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        // SAFETY: `sysconf` reads a system constant and touches no memory of ours.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let pages = map.len().div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: `map.as_ptr()` is the page-aligned start of a live mapping of `map.len()`
        // bytes (kept alive by `map` for the call), and `vec` holds one byte for each of its
        // `ceil(len / page)` pages, which is exactly what `mincore` writes.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        (vec.iter().filter(|&&b| b & 1 == 1).count(), pages)
    }

    /// Whether `dir` is on a memory-backed file system (tmpfs or ramfs), where every page of a
    /// file is always resident and `POSIX_FADV_DONTNEED` can drop nothing.
    #[cfg(target_os = "linux")]
    #[allow(clippy::unnecessary_cast)] // `f_type` and the magic numbers differ in type by target.
    fn memory_backed(dir: &Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a NUL-terminated path and `st` a writable `statfs` owned by this
        // frame; `statfs` writes only into `st`.
        let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
        assert_eq!(
            rc,
            0,
            "statfs {}: {}",
            dir.display(),
            io::Error::last_os_error()
        );
        let kind = st.f_type as i64;
        kind == libc::TMPFS_MAGIC as i64 || kind == RAMFS_MAGIC
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn evicting_drops_resident_pages_and_keeps_contents() {
        // The first candidate on a real disk: the system temp dir is tmpfs on many systems,
        // /var/tmp rarely is.
        let candidates = [std::env::temp_dir(), std::path::PathBuf::from("/var/tmp")];
        let base = candidates.iter().find(|d| d.is_dir() && !memory_backed(d));
        let base = match base {
            Some(b) => b.clone(),
            None => {
                // Say so loudly rather than pass as if eviction had been checked.
                eprintln!(
                    "evicting_drops_resident_pages_and_keeps_contents: {candidates:?} are all \
                     memory-backed (tmpfs/ramfs), where POSIX_FADV_DONTNEED drops nothing; only \
                     residency after reading and unchanged contents are checked here, NOT eviction"
                );
                candidates[0].clone()
            }
        };
        let check_eviction = !memory_backed(&base);
        let dir = base.join(format!("trainmem-evict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        let bytes: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();

        // Cold: the freshly written (dirty) pages are written back and dropped.
        evict_page_cache(&path).unwrap();
        let (cold, pages) = resident_pages(&path);
        // Reading the file brings every page in.
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let (warm, _) = resident_pages(&path);
        // (All of them, barring reclaim under memory pressure in the moment between.)
        assert!(
            warm >= pages - pages / 10,
            "only {warm} of {pages} pages resident after reading the whole file"
        );
        // Evicting drops them again, and never changes what the file holds.
        evict_page_cache(&path).unwrap();
        let (evicted, _) = resident_pages(&path);
        eprintln!(
            "{}: {pages} pages; resident after writing and evicting {cold}, after reading \
             {warm}, after evicting {evicted}",
            base.display()
        );
        if check_eviction {
            assert!(
                cold <= pages / 10,
                "eviction after writing left {cold} of {pages} pages resident"
            );
            assert!(
                evicted <= pages / 10,
                "eviction after reading left {evicted} of {pages} pages resident"
            );
        } else {
            assert_eq!(
                evicted, pages,
                "a memory-backed file system keeps every page"
            );
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = evict_page_cache(Path::new("/nonexistent/trainmem/evict.bin")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
