//! Streams: the queues of device work that blocks are associated with.

/// Identifies a stream. A freed block is reused only for requests on the stream it was
/// allocated on. [`StreamId::DEFAULT`] (0) is the default stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default stream (id 0).
    pub const DEFAULT: StreamId = StreamId(0);
}

impl From<u64> for StreamId {
    fn from(v: u64) -> Self {
        StreamId(v)
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
