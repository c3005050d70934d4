//! `cargo xtask unused-deps`: every dependency a workspace member declares is named in its
//! code.
//!
//! For each member's `Cargo.toml`, every entry of `[dependencies]`, `[dev-dependencies]`,
//! `[build-dependencies]` (and their `[target.'cfg(..)'.*]` forms) must appear as a Rust
//! identifier (`-` read as `_`) in one of the member's `.rs` files: `use`, a path, a macro,
//! `extern crate`. A dependency that is only there for its features or its linking names
//! itself in `[package.metadata.cargo-machete] ignored = [...]` (the same key cargo-machete
//! reads). The check reads text only, so it runs in a moment and needs no extra tool.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The dependency names declared in a manifest's dependency tables, and the names it asks to
/// ignore.
fn declared(manifest: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut deps = BTreeSet::new();
    let mut ignored = BTreeSet::new();
    let mut in_deps = false;
    let mut in_ignore_table = false;
    for raw in manifest.lines() {
        let line = raw.trim();
        if line.starts_with('[') {
            let table = line.trim_matches(|c| c == '[' || c == ']');
            in_deps = table.ends_with("dependencies") && !table.starts_with("workspace");
            in_ignore_table = table == "package.metadata.cargo-machete";
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if in_deps {
            let name = line
                .split(['=', '.', ' '])
                .next()
                .unwrap_or("")
                .trim_matches('"');
            if !name.is_empty() {
                deps.insert(name.to_string());
            }
        } else if in_ignore_table && line.starts_with("ignored") {
            for part in line.split('"').skip(1).step_by(2) {
                ignored.insert(part.to_string());
            }
        }
    }
    (deps, ignored)
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether `ident` occurs in `text` as a whole identifier.
fn names(text: &str, ident: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(ident).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + ident.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The declared dependencies of the member at `dir` that its code never names.
pub fn unused_in(dir: &Path) -> Result<Vec<String>> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))
        .with_context(|| format!("reading {}/Cargo.toml", dir.display()))?;
    let (deps, ignored) = declared(&manifest);
    let mut files = Vec::new();
    rust_files(dir, &mut files)?;
    let mut code = String::new();
    for f in &files {
        code.push_str(
            &std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        );
        code.push('\n');
    }
    Ok(deps
        .into_iter()
        .filter(|d| !ignored.contains(d) && !names(&code, &d.replace('-', "_")))
        .collect())
}

/// Checks every member of the workspace at `root` (`crates/*`, `xtask`, `tests`); prints the
/// unused dependencies and returns whether there were none.
pub fn run(root: &Path) -> Result<bool> {
    let mut members: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .context("reading crates/")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    members.sort();
    members.push(root.join("xtask"));
    members.push(root.join("tests"));
    let mut clean = true;
    for m in &members {
        let unused = unused_in(m)?;
        if !unused.is_empty() {
            clean = false;
            let rel = m.strip_prefix(root).unwrap_or(m);
            println!(
                "{}: declared but never named in its code: {}",
                rel.display(),
                unused.join(", ")
            );
        }
    }
    if clean {
        println!(
            "unused-deps: every dependency of the {} members is used",
            members.len()
        );
    }
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependency_tables_are_read_and_others_are_not() {
        let manifest = r#"
[package]
name = "x"
[package.metadata.cargo-machete]
ignored = ["burn-cubecl", "other"]
[dependencies]
trainmem-core.workspace = true
serde = { workspace = true }
memmap2 = "=0.9"
[target.'cfg(target_os = "linux")'.dependencies]
libc.workspace = true
[dev-dependencies]
proptest.workspace = true
[features]
cuda = ["dep:cudarc"]
"#;
        let (deps, ignored) = declared(manifest);
        let want: BTreeSet<String> = ["trainmem-core", "serde", "memmap2", "libc", "proptest"]
            .map(String::from)
            .into();
        assert_eq!(deps, want);
        assert!(ignored.contains("burn-cubecl") && ignored.contains("other"));
    }

    #[test]
    fn an_identifier_counts_only_whole() {
        assert!(names("use serde::Serialize;", "serde"));
        assert!(names("x = trainmem_core::plan::Plan", "trainmem_core"));
        assert!(!names("use serde_json::Value;", "serde"));
        assert!(!names("my_serde", "serde"));
    }

    #[test]
    fn this_workspace_has_no_unused_dependency() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root");
        assert!(run(root).expect("readable manifests"));
    }
}
