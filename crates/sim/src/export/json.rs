//! The JSON timeline (the [`Timeline`] serde form) and the JSON report.

use super::ExportError;
use crate::report::Report;
use crate::timeline::Timeline;

/// The timeline as pretty JSON.
pub fn timeline_json(t: &Timeline) -> Result<String, ExportError> {
    Ok(serde_json::to_string_pretty(t)?)
}

/// The report as pretty JSON.
pub fn report_json(r: &Report) -> Result<String, ExportError> {
    Ok(serde_json::to_string_pretty(r)?)
}
