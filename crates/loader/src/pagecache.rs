//! Dropping a file's pages from the OS page cache, so that the next read of a memory-mapped
//! data set comes from disk (a cold-cache measurement, or a streaming run whose page cache must
//! be charged to the reader's memory cgroup rather than to whoever cached the file before).

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
        // Tested by `tests::evicts_and_keeps_contents`.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_and_keeps_contents() {
        let dir = std::env::temp_dir().join(format!("trainmem-evict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        evict_page_cache(&path).unwrap();
        // Dropping cached pages never changes what the file holds.
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = evict_page_cache(Path::new("/nonexistent/trainmem/evict.bin")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
