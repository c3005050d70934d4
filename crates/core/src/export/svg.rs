//! A self-contained SVG: stacked areas of bytes per category over the timeline, one panel for
//! the device and one for the host. Long timelines are reduced to at most 1,500 columns,
//! keeping in each column the sample with the highest total so that peaks survive.

use std::fmt::Write as _;

use crate::Category;

use crate::bytes::human;
use crate::timeline::{Domain, Timeline};

/// Colours per category (PyTorch memory-timeline colours where they exist).
pub fn colour(c: Category) -> &'static str {
    match c {
        Category::Parameter => "#006400",
        Category::Gradient => "#0000cd",
        Category::OptimizerState => "#daa520",
        Category::Activation => "#dc143c",
        Category::Input => "#333333",
        Category::Temporary => "#9370db",
        Category::Cache => "#c0c0c0",
        Category::Other => "#8fbc8f",
    }
}

const W: f64 = 1000.0;
const PANEL_H: f64 = 260.0;
const LEFT: f64 = 80.0;
const TOP: f64 = 40.0;

fn columns(values: &[u64], max: usize) -> Vec<usize> {
    if values.len() <= max {
        return (0..values.len()).collect();
    }
    let per = values.len().div_ceil(max);
    (0..values.len())
        .step_by(per)
        .map(|s| {
            (s..(s + per).min(values.len()))
                .max_by_key(|&i| values[i])
                .unwrap_or(s)
        })
        .collect()
}

/// Where a panel's columns and byte counts fall in the picture.
struct PanelScale {
    y0: f64,
    ymax: f64,
    n: f64,
}

impl PanelScale {
    /// The x of column `k`.
    fn x(&self, k: usize) -> f64 {
        LEFT + (W - LEFT - 20.0) * k as f64 / (self.n - 1.0)
    }

    /// The y of `b` bytes.
    fn y(&self, b: f64) -> f64 {
        self.y0 + PANEL_H - PANEL_H * b / self.ymax
    }
}

fn panel(o: &mut String, t: &Timeline, domain: Domain, y0: f64) {
    let cats: Vec<Category> = Category::ALL
        .into_iter()
        .filter(|&c| !(domain == Domain::Host && c == Category::Cache))
        .collect();
    let totals: Vec<u64> = (0..t.samples.len())
        .map(|i| {
            let c = t.categories(i, domain);
            cats.iter().map(|&k| c.get(k)).sum::<u64>()
                + if domain == Domain::Host {
                    t.samples[i].host.file_rss
                } else {
                    0
                }
        })
        .collect();
    let cols = columns(&totals, 1500);
    let peak = totals.iter().copied().max().unwrap_or(0);
    let scale = PanelScale {
        y0,
        ymax: peak.max(1) as f64,
        n: cols.len().max(2) as f64,
    };
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="{:.1}" font-size="14" font-weight="bold">{} memory ({})</text>"#,
        y0 - 8.0,
        domain.name(),
        t.source
    );
    let series = panel_series(t, domain, &cats, &cols);
    stacked_areas(o, &series, cols.len(), &scale);
    byte_ticks(o, peak, &scale);
}

/// Each category's bytes per column (and on the host, the page cache's), named and coloured.
fn panel_series(
    t: &Timeline,
    domain: Domain,
    cats: &[Category],
    cols: &[usize],
) -> Vec<(String, &'static str, Vec<u64>)> {
    let mut series: Vec<(String, &'static str, Vec<u64>)> = cats
        .iter()
        .map(|&c| {
            (
                c.name().to_string(),
                colour(c),
                cols.iter()
                    .map(|&i| t.categories(i, domain).get(c))
                    .collect(),
            )
        })
        .collect();
    if domain == Domain::Host {
        series.push((
            "page cache (file RSS)".into(),
            "#87ceeb",
            cols.iter().map(|&i| t.samples[i].host.file_rss).collect(),
        ));
    }
    series
}

/// Draws the series stacked one on another, skipping those that stay at 0.
fn stacked_areas(
    o: &mut String,
    series: &[(String, &'static str, Vec<u64>)],
    columns: usize,
    scale: &PanelScale,
) {
    let mut base = vec![0u64; columns];
    for (name, col, vals) in series {
        if vals.iter().all(|&v| v == 0) {
            continue;
        }
        let mut pts = String::new();
        for (k, v) in vals.iter().enumerate() {
            let _ = write!(
                pts,
                "{:.1},{:.1} ",
                scale.x(k),
                scale.y((base[k] + v) as f64)
            );
        }
        for k in (0..vals.len()).rev() {
            let _ = write!(pts, "{:.1},{:.1} ", scale.x(k), scale.y(base[k] as f64));
        }
        let _ = writeln!(
            o,
            r#"<polygon points="{pts}" fill="{col}" fill-opacity="0.85"><title>{name}</title></polygon>"#
        );
        for (k, v) in vals.iter().enumerate() {
            base[k] += v;
        }
    }
}

/// Draws the byte axis: gridlines and labels at quarters of the peak.
fn byte_ticks(o: &mut String, peak: u64, scale: &PanelScale) {
    // A panel without bytes gets its baseline only, not a made-up scale of 0 to 1 B.
    let ticks: &[f64] = if peak == 0 {
        &[0.0]
    } else {
        &[0.0, 0.25, 0.5, 0.75, 1.0]
    };
    for &f in ticks {
        let yy = scale.y(scale.ymax * f);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#999" stroke-width="0.5"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            W - 20.0,
            LEFT - 4.0,
            yy + 3.0,
            human((scale.ymax * f) as u64)
        );
    }
}

/// Renders the chart.
pub fn render_svg(t: &Timeline) -> String {
    let h = TOP + 2.0 * (PANEL_H + 60.0) + 40.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="20" font-size="16">trainmem: {} ({} samples; x = phase boundaries in order)</text>"#,
        xml_escape(&t.meta.name),
        t.samples.len()
    );
    panel(&mut o, t, Domain::Device, TOP + 20.0);
    panel(&mut o, t, Domain::Host, TOP + PANEL_H + 80.0);
    let ly = h - 20.0;
    for (k, c) in Category::ALL.into_iter().enumerate() {
        let lx = LEFT + k as f64 * 110.0;
        let _ = writeln!(
            o,
            r#"<rect x="{lx}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{ly}" font-size="11">{}</text>"#,
            ly - 9.0,
            colour(c),
            lx + 14.0,
            c.name()
        );
    }
    o.push_str("</svg>\n");
    o
}

/// Escapes character data; control characters, which XML 1.0 does not allow even escaped,
/// become U+FFFD.
fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .chars()
        .map(|c| {
            if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimation_keeps_the_peak() {
        let mut v = vec![1u64; 10_000];
        v[4321] = 99;
        let cols = columns(&v, 100);
        assert!(cols.len() <= 100);
        assert!(cols.contains(&4321));
    }
}
