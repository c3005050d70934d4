//! Holds the working tree small enough for the prepared GPU check to travel.
//!
//! A lent GPU machine gets the repository's working tree plus the carried folders, 64 MiB in
//! all. `scripts/device-bundle.sh` carries the binaries stripped and xz-compressed beside the
//! tree; measured on 2026-11-29 they took [`BUNDLE_MEASURED`] bytes. Fixtures grow with every
//! recording: once the tree leaves less than the bundle (with a margin) the next lent session
//! could not run the check at all, so this test fails first, here.

use std::path::Path;
use std::process::Command;

/// What a device call carries at most: the working tree and the carried folders together.
const CALL_LIMIT: u64 = 64 * 1024 * 1024;

/// `scripts/device-bundle.sh`'s output on 2026-11-29 (`travels: ... carried N B`): xtask built
/// with `cuda` and with `fusion`, the allocator's CUDA test, litgpt's wheel.
const BUNDLE_MEASURED: u64 = 18_908_440;

/// Room kept beside the bundle for the binaries to grow.
const MARGIN: u64 = 3 * 1024 * 1024;

/// The bytes and the number of the files that travel: git's tracked files where the checkout
/// is a git repository, else every file but the ignored folders (more than travels, never
/// less).
fn travelling(root: &Path) -> (u64, usize) {
    let listed = Command::new("git")
        .args(["ls-files", "-z", "--cached"])
        .current_dir(root)
        .output();
    if let Ok(listed) = listed
        && listed.status.success()
        && !listed.stdout.is_empty()
    {
        let (mut bytes, mut files) = (0u64, 0usize);
        for name in listed.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            let name = std::str::from_utf8(name).expect("a UTF-8 path");
            // a file deleted in the working tree but not in the index does not travel
            if let Ok(meta) = std::fs::metadata(root.join(name)) {
                bytes += meta.len();
                files += 1;
            }
        }
        return (bytes, files);
    }
    const IGNORED: [&str; 8] = [
        "target",
        ".git",
        ".device",
        ".gl",
        ".whl",
        "__pycache__",
        "venv",
        ".venv",
    ];
    let (mut bytes, mut files) = (0u64, 0usize);
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a readable folder") {
            let entry = entry.expect("a directory entry");
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                if !IGNORED.contains(&entry.file_name().to_string_lossy().as_ref()) {
                    dirs.push(entry.path());
                }
            } else if kind.is_file() {
                bytes += entry.metadata().expect("metadata").len();
                files += 1;
            }
        }
    }
    (bytes, files)
}

#[test]
fn the_working_tree_leaves_room_for_the_device_bundle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (tree, files) = travelling(&root);
    assert!(files > 100, "the repository's files were listed ({files})");
    let room = CALL_LIMIT - BUNDLE_MEASURED - MARGIN;
    assert!(
        tree <= room,
        "the tracked files take {tree} B: the device bundle ({BUNDLE_MEASURED} B) and its \
         margin no longer fit beside them in a device call's {CALL_LIMIT} B; shrink the \
         fixtures (compress or trim them) before committing more"
    );
}
