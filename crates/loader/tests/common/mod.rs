//! Helpers shared by the integration tests: unique temp directories, cleaned on drop.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "trainmem-loader-test-{}-{tag}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `.npy` file with an arbitrary header dict (padded so the data starts at 64) and data.
pub fn npy_with_dict(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let prefix = if major == 1 { 10 } else { 12 };
    let mut text = dict.as_bytes().to_vec();
    let total = (prefix + text.len() + 1).div_ceil(64) * 64;
    text.resize(total - prefix - 1, b' ');
    text.push(b'\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, 0]);
    if major == 1 {
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&text);
    out.extend_from_slice(data);
    out
}
