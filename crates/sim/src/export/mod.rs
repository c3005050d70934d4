//! Exports of a simulation: the JSON timeline, Chrome trace-event counters (Perfetto), a
//! PyTorch memory-snapshot pickle (pytorch.org/memory_viz), and an SVG stacked-area chart;
//! [`files`] names the files they are written to.

pub mod chrome;
pub mod files;
pub mod json;
pub mod pickle;
pub mod svg;

/// Errors writing an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// JSON serialisation failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Pickle serialisation failed.
    #[error("pickle: {0}")]
    Pickle(String),
    /// Nothing to export (e.g. no allocator snapshot without a trace).
    #[error("{0}")]
    Missing(String),
}
