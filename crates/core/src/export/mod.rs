//! Exports of any [`Timeline`], measured, simulated or Meta's: the JSON
//! timeline, Chrome trace-event counters (Perfetto), and an SVG stacked-area chart; [`files`]
//! names the files every command writes them to. (The allocator's memory_viz pickle is
//! trainmem-alloc's `pytorch::pickle`; a simulation's report is trainmem-sim's.)

pub mod chrome;
pub mod files;
pub mod svg;

use crate::Timeline;

/// Errors writing an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// JSON serialisation failed.
    #[error("json")]
    Json(#[from] serde_json::Error),
    /// Nothing to export (e.g. no allocator snapshot without a trace).
    #[error("{0}")]
    Missing(String),
}

/// The timeline as pretty JSON (its serde form).
pub fn timeline_json(t: &Timeline) -> Result<String, ExportError> {
    Ok(serde_json::to_string_pretty(t)?)
}
