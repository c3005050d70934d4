//! Why a measured run can fail.

use std::path::PathBuf;

/// Errors of a measured burn run.
#[derive(Debug, thiserror::Error)]
pub enum BurnRunError {
    /// The plan asks for something the burn run cannot do (a model kind, a knob value).
    #[error("not supported in a burn run: {0}")]
    Unsupported(String),
    /// The data did not fit the network (shapes, lengths, a loader failure).
    #[error("data: {0}")]
    Data(String),
    /// The backend reported an execution error while syncing.
    #[error("backend: {0}")]
    Backend(String),
    /// Writing or reading a checkpoint failed.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A file-system operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
