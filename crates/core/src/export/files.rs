//! The names of the files trainmem writes, the same from every command (`trainmem simulate
//! --out`, `trainmem scenario`, `cargo xtask scenario`), so a folder of results reads the
//! same whoever made it.

/// The memory timeline (or, from a scenario, every run's timelines and verdicts), JSON.
pub const TIMELINE_JSON: &str = "timeline.json";
/// The stacked chart of the timeline, SVG.
pub const TIMELINE_SVG: &str = "timeline.svg";
/// Chrome trace-event counters (Perfetto, chrome://tracing), JSON.
pub const TRACE_JSON: &str = "trace.json";
/// The caching allocator's snapshot as PyTorch writes it (pytorch.org/memory_viz).
pub const MEMORY_VIZ_PICKLE: &str = "memory_viz.pickle";
/// A simulation's report, JSON.
pub const REPORT_JSON: &str = "report.json";
/// A simulation's report, text.
pub const REPORT_TXT: &str = "report.txt";
/// A scenario's report, Markdown.
pub const REPORT_MD: &str = "report.md";
