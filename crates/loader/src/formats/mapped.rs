//! [`MappedFile`]: one whole file mapped read-only, the storage of the token, indexed, Arrow
//! and safetensors data sets. Its length is recorded at open and re-checked by
//! [`MappedFile::check_unchanged`] (the same rule as `MappedArray`'s: a file must not shrink
//! while mapped).

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{DataError, FileProblem};

/// A file mapped read-only; an empty file has no mapping and reads as no bytes.
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    file: File,
    map: Option<Mmap>,
    len: u64,
}

fn io(path: &Path, e: std::io::Error) -> DataError {
    DataError::file(path, FileProblem::Io(e))
}

/// Errors ([`FileProblem::Shrunk`]) if `file`, `opened` bytes long when it was opened as
/// `path`, is shorter now: a mapping made then would reach past its end, and reading there
/// raises SIGBUS. Every memory-mapped data set runs this check before it is read again.
pub(crate) fn check_not_shrunk(file: &File, path: &Path, opened: u64) -> Result<(), DataError> {
    let now = file.metadata().map_err(|e| io(path, e))?.len();
    if now < opened {
        return Err(DataError::file(path, FileProblem::Shrunk { opened, now }));
    }
    Ok(())
}

impl MappedFile {
    /// Opens and maps `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<MappedFile, DataError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| io(path, e))?;
        let len = file.metadata().map_err(|e| io(path, e))?.len();
        let map = if len == 0 {
            None
        } else {
            // SAFETY: mapping a file is unsafe because another process may truncate or modify
            // it while mapped. Every read goes through `bytes()`, which is as long as the
            // mapping made here; the file stays open with the map; `check_unchanged` re-checks
            // the length at every epoch start (the loader calls it), and the crate docs warn
            // against rewriting a data set in place while it is read.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| io(path, e))?;
            if (map.len() as u64) < len {
                return Err(DataError::file(
                    path,
                    FileProblem::Shrunk {
                        opened: len,
                        now: map.len() as u64,
                    },
                ));
            }
            Some(map)
        };
        Ok(MappedFile {
            path: path.to_path_buf(),
            file,
            map,
            len,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its length in bytes at open.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All its bytes (a view of the mapping).
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// `len` bytes from `offset`, or `None` past the end.
    pub fn get(&self, offset: usize, len: usize) -> Option<&[u8]> {
        self.bytes().get(offset..offset.checked_add(len)?)
    }

    /// Errors if the file is now shorter than at open (reading it could raise SIGBUS).
    pub fn check_unchanged(&self) -> Result<(), DataError> {
        check_not_shrunk(&self.file, &self.path, self.len)
    }

    /// Advises the kernel of the coming access pattern (sequential or random).
    pub fn advise(&self, sequential: bool) {
        if let Some(map) = &self.map {
            let advice = if sequential {
                memmap2::Advice::Sequential
            } else {
                memmap2::Advice::Random
            };
            // Advice only tunes read-ahead; a refusal changes nothing that matters.
            let _ = map.advise(advice);
        }
    }

    /// The open file, its length at open, and the mapping as shared bytes for readers that
    /// keep views into it (Arrow buffers).
    pub(crate) fn into_parts(self) -> (File, u64, Option<bytes::Bytes>) {
        (self.file, self.len, self.map.map(bytes::Bytes::from_owner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_reads_and_notices_a_shrink() {
        let dir = std::env::temp_dir().join(format!("trainmem-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f.bin");
        std::fs::write(&path, (0u8..200).collect::<Vec<_>>()).expect("write");
        let m = MappedFile::open(&path).expect("open");
        assert_eq!(m.len(), 200);
        assert_eq!(m.get(10, 3), Some(&[10u8, 11, 12][..]));
        assert_eq!(m.get(199, 2), None);
        assert_eq!(m.get(usize::MAX, 2), None);
        m.check_unchanged().expect("unchanged");
        std::fs::write(&path, [0u8; 10]).expect("shrink");
        assert!(matches!(
            m.check_unchanged(),
            Err(DataError::File {
                problem: FileProblem::Shrunk {
                    opened: 200,
                    now: 10
                },
                ..
            })
        ));
        std::fs::write(&path, []).expect("empty");
        let e = MappedFile::open(&path).expect("empty opens");
        assert!(e.is_empty() && e.bytes().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
