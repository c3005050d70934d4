//! The `memory_summary()` text table.

use std::fmt::Write;

use crate::size::format_size;
use crate::stats::{MemoryStats, Stat, StatArray};

const WIDTH: usize = 81;

fn rule(out: &mut String, c: char) {
    out.push('|');
    out.extend(std::iter::repeat_n(c, WIDTH - 2));
    out.push_str("|\n");
}

fn centered(out: &mut String, text: &str) {
    let inner = WIDTH - 2;
    let _ = writeln!(out, "|{text:^inner$}|");
}

fn fmt_count(v: i64) -> String {
    // Counts: plain integers, with K/M suffixes for large values.
    let a = v.unsigned_abs();
    let sign = if v < 0 { "-" } else { "" };
    if a < 100_000 {
        format!("{sign}{a}")
    } else if a < 100_000_000 {
        format!("{sign}{}K", a / 1000)
    } else {
        format!("{sign}{}M", a / 1_000_000)
    }
}

fn fmt_bytes(v: i64) -> String {
    let sign = if v < 0 { "-" } else { "" };
    format!("{sign}{}", format_size(v.unsigned_abs()))
}

fn row(out: &mut String, name: &str, s: &Stat, bytes: bool) {
    let f = if bytes { fmt_bytes } else { fmt_count };
    let _ = writeln!(
        out,
        "| {name:<22}|{:>12} |{:>12} |{:>12} |{:>12} |",
        f(s.current),
        f(s.peak),
        f(s.allocated),
        f(s.freed)
    );
}

fn array(out: &mut String, name: &str, a: &StatArray, bytes: bool) {
    row(out, name, &a.all, bytes);
    row(out, "    from large pool", &a.large_pool, bytes);
    row(out, "    from small pool", &a.small_pool, bytes);
    rule(out, '-');
}

/// Renders the statistics as a table: one row group per statistic (all / large pool /
/// small pool) with columns Cur Usage, Peak Usage, Tot Alloc, Tot Freed.
pub(crate) fn memory_summary(st: &MemoryStats, device: &str) -> String {
    let mut out = String::new();
    rule(&mut out, '=');
    centered(&mut out, &format!("trainmem memory summary, {device}"));
    rule(&mut out, '-');
    centered(
        &mut out,
        &format!(
            "OOMs: {}   |   device alloc retries: {}   |   device allocs/frees: {}/{}",
            st.num_ooms, st.num_alloc_retries, st.num_device_alloc, st.num_device_free
        ),
    );
    rule(&mut out, '=');
    let _ = writeln!(
        out,
        "| {:<22}|{:>12} |{:>12} |{:>12} |{:>12} |",
        "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
    );
    rule(&mut out, '-');
    array(&mut out, "Allocated memory", &st.allocated_bytes, true);
    array(&mut out, "Active memory", &st.active_bytes, true);
    array(&mut out, "Requested memory", &st.requested_bytes, true);
    array(&mut out, "GPU reserved memory", &st.reserved_bytes, true);
    array(
        &mut out,
        "Non-releasable memory",
        &st.inactive_split_bytes,
        true,
    );
    array(&mut out, "Allocations", &st.allocation, false);
    array(&mut out, "Active allocs", &st.active, false);
    array(&mut out, "GPU reserved segments", &st.segment, false);
    array(&mut out, "Non-releasable allocs", &st.inactive_split, false);
    row(
        &mut out,
        "Oversize allocations",
        &st.oversize_allocations,
        false,
    );
    row(
        &mut out,
        "Oversize GPU segments",
        &st.oversize_segments,
        false,
    );
    rule(&mut out, '=');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::PoolKind;

    #[test]
    fn summary_has_rows_and_columns() {
        let mut st = MemoryStats::default();
        st.allocated_bytes.increase(PoolKind::Large, 3 << 20);
        st.allocation.increase(PoolKind::Large, 1);
        let s = memory_summary(&st, "simulated device");
        for label in [
            "Allocated memory",
            "Active memory",
            "Requested memory",
            "GPU reserved memory",
            "Non-releasable memory",
            "Allocations",
            "Active allocs",
            "GPU reserved segments",
            "Non-releasable allocs",
            "Oversize allocations",
            "Oversize GPU segments",
            "Cur Usage",
            "Peak Usage",
            "Tot Alloc",
            "Tot Freed",
        ] {
            assert!(s.contains(label), "missing {label}\n{s}");
        }
        assert!(s.contains("3.00 MiB"));
        for line in s.lines() {
            assert_eq!(line.chars().count(), WIDTH, "{line}");
        }
        assert_eq!(fmt_count(123_456), "123K");
    }
}
