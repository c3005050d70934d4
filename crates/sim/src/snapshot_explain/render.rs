//! The explanation in words.

use std::fmt::Write;

use super::remedies::RemedyKind;
use super::{Moment, SnapshotExplanation};

fn human(b: u64) -> String {
    trainmem_core::bytes::human(b)
}

fn moment(out: &mut String, title: &str, m: &Moment) {
    let phase = m.phase.map_or("no phase recorded", |p| p.name());
    let _ = writeln!(
        out,
        "{title}: {} of tensors live at trace entry {} ({phase}, cycle {})",
        human(m.live_bytes),
        m.entry,
        m.cycle
    );
    for (c, b) in &m.by_category {
        let share = *b as f64 * 100.0 / m.live_bytes.max(1) as f64;
        let _ = writeln!(out, "  {:<16} {:>12}  {share:5.1}%", c.name(), human(*b));
    }
    if !m.top_sites.is_empty() {
        let _ = writeln!(out, "  top sites:");
        for s in &m.top_sites {
            let _ = writeln!(
                out,
                "    {:>12}  {:>5}×  {:<15} {}",
                human(s.bytes),
                s.count,
                s.category.name(),
                s.site
            );
        }
    }
}

/// The report as text.
pub fn render_text(name: &str, ex: &SnapshotExplanation) -> String {
    let mut out = String::new();
    header(&mut out, name, ex);
    moment(&mut out, "peak", &ex.peak);
    if let Some(o) = &ex.oom {
        out.push('\n');
        moment(&mut out, "out of memory", o);
    }
    if let Some(r) = &ex.oom_request {
        let capacity = r
            .capacity
            .map_or(String::new(), |c| format!(" of the device's {}", human(c)));
        let needed = r.needed_reserved.map_or(String::new(), |n| {
            format!(
                "; with room, the run would have reserved {} up to this point",
                human(n)
            )
        });
        let _ = writeln!(
            out,
            "  the allocation that failed: {} with {} free{capacity}{needed}",
            human(r.requested),
            human(r.device_free)
        );
    }
    out.push('\n');
    moment(&mut out, "when the snapshot was taken", &ex.end);
    out.push('\n');
    steps(&mut out, ex);
    if let Some(g) = &ex.growth {
        let kept = match &g.site {
            Some(site) => format!("most kept by {site} ({})", human(g.site_bytes)),
            None => "no one site keeps allocations of several steps".to_string(),
        };
        let _ = writeln!(
            out,
            "growth: {} more live after each of the last {} steps than after the one before: \
             a leak; {kept}",
            human(g.bytes_per_step),
            g.steps_growing,
        );
    }
    if let Some(a) = &ex.allocator {
        let _ = writeln!(
            out,
            "\nallocator at the peak: reserved {}, allocated {}, cached but unused {}, largest \
             free block {}, empty_cache() would release {}; peak reserved of the recording {}",
            human(a.reserved),
            human(a.allocated),
            human(a.reserved.saturating_sub(a.allocated)),
            human(a.largest_free_block),
            human(a.empty_cache_would_release),
            human(a.peak_reserved)
        );
    }
    remedies(&mut out, ex);
    for n in &ex.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// The device explained and how its categories were decided.
fn header(out: &mut String, name: &str, ex: &SnapshotExplanation) {
    let c = &ex.coverage;
    let _ = writeln!(out, "{name}: what filled device {}", ex.device);
    let _ = writeln!(
        out,
        "{} of {} trace entries recorded a stack; at the peak {:.1}% of bytes were categorised \
         by their own frames and {:.1}% by lifetime alone",
        c.entries_with_frames,
        c.entries,
        c.peak_share_by_frames * 100.0,
        c.peak_share_by_lifetime * 100.0
    );
    let _ = writeln!(
        out,
        "model state counted from: {} ({} parameter tensors)",
        ex.model_state.counted_from, ex.model_state.parameter_tensors
    );
    if ex.model_state.state_made_by_user_code > 0 {
        let _ = writeln!(
            out,
            "optimizer state made by the user's own code: {} tensors, whole copies of the \
             parameters' sizes kept beside the model",
            ex.model_state.state_made_by_user_code
        );
    }
    out.push('\n');
}

/// The steps found.
fn steps(out: &mut String, ex: &SnapshotExplanation) {
    if ex.steps.is_empty() {
        let _ = writeln!(
            out,
            "steps: none found (no backward or optimizer step in the stacks)"
        );
    } else {
        let _ = writeln!(out, "steps: {}", ex.steps.len());
        for s in &ex.steps {
            let _ = writeln!(
                out,
                "  cycle {:>3}: entries {}..={}, peak {}, live at its end {}",
                s.cycle,
                s.start,
                s.end,
                human(s.peak_bytes),
                human(s.end_bytes)
            );
        }
    }
}

/// The remedies, when there are any.
fn remedies(out: &mut String, ex: &SnapshotExplanation) {
    if ex.remedies.is_empty() {
        return;
    }
    let oom = ex.oom_request.is_some();
    let cap = ex.capacity.map_or(String::new(), |c| {
        if oom {
            format!(" (past the failed allocation in {}?)", human(c))
        } else {
            format!(" (fits {}?)", human(c))
        }
    });
    let (helping, not): (Vec<_>, Vec<_>) = ex.remedies.iter().partition(|r| r.saved_bytes > 0);
    if !helping.is_empty() {
        let _ = writeln!(out, "\nremedies, most bytes saved at the peak first{cap}:");
    }
    for r in helping {
        let kind = match r.kind {
            RemedyKind::Replayed => "replayed",
            RemedyKind::Estimated => "estimated",
        };
        let fits = match (r.fits, oom) {
            (Some(true), false) => " — fits",
            (Some(false), false) => " — does not fit",
            (Some(true), true) => " — gets past it",
            (Some(false), true) => " — out of memory there still",
            (None, _) => "",
        };
        let _ = writeln!(
            out,
            "  {:>12}  [{kind}] {}{fits}\n                {}",
            human(r.saved_bytes),
            r.name,
            r.detail
        );
    }
    // the settings replayed that save nothing here, on one line with what each does instead
    if !not.is_empty() {
        let recorded = match ex.oom_request {
            Some(o) => o.needed_reserved,
            None => ex.allocator.map(|a| a.peak_reserved),
        };
        let each: Vec<String> = not
            .iter()
            .map(|r| match (r.peak_reserved, recorded) {
                (Some(with), Some(was)) if with > was => {
                    format!("{} (peak reserved {} more)", r.name, human(with - was))
                }
                (Some(_), _) => format!("{} (peak reserved unchanged)", r.name),
                (None, _) => format!("{} ({})", r.name, r.detail),
            })
            .collect();
        let _ = writeln!(out, "\nreplayed, saving nothing here: {}", each.join("; "));
    }
}
