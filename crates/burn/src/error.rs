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
    /// The data set or the loader failed (writing or opening the fixture, starting an epoch).
    #[error("data: {what}")]
    Loader {
        /// What was being done.
        what: &'static str,
        /// The loader's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The backend reported an execution error while syncing.
    #[error("backend: {0}")]
    Backend(String),
    /// Writing a checkpoint failed.
    #[error("checkpoint {}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// burn's recorder error.
        #[source]
        source: burn::record::RecorderError,
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
