//! The SVG chart (trainmem-core's `export::svg::render_svg`) of simulated timelines: well-formed XML, one stacked series per
//! category that holds bytes, axis labels in bytes, and a plotted extent that follows the
//! timeline (the stack's top at each column maps back to that sample's total on the axis).

use trainmem_core::Category;
use trainmem_core::bytes::human;
use trainmem_core::export::svg::{colour, render_svg};
use trainmem_core::{Phase, Plan, Sample, Source, Timeline, timeline::TimelineMeta};
use trainmem_sim::SimOptions;

// ---------------------------------------------------------------------------------------
// A small XML reader: enough of XML 1.0 to reject what is not well-formed (unbalanced or
// mismatched tags, unquoted or repeated attributes, a bare `<` or `&`, an unknown entity,
// characters XML forbids, text outside the root) and to walk what is.

#[derive(Debug, Clone)]
struct Element {
    name: String,
    attrs: Vec<(String, String)>,
    children: Vec<Node>,
}

#[derive(Debug, Clone)]
enum Node {
    Element(Element),
    Text(String),
}

impl Element {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        self.children
            .iter()
            .map(|c| match c {
                Node::Text(t) => t.clone(),
                Node::Element(e) => e.text(),
            })
            .collect()
    }

    fn elements(&self) -> impl Iterator<Item = &Element> {
        self.children.iter().filter_map(|c| match c {
            Node::Element(e) => Some(e),
            Node::Text(_) => None,
        })
    }
}

struct Reader<'a> {
    s: &'a str,
    i: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &str {
        &self.s[self.i..]
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at byte {}", self.i))
    }

    fn skip_ws(&mut self) {
        while self.rest().starts_with([' ', '\t', '\n', '\r']) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let start = self.i;
        let len = self
            .rest()
            .char_indices()
            .take_while(|&(k, c)| {
                c.is_ascii_alphabetic()
                    || c == '_'
                    || c == ':'
                    || (k > 0 && (c.is_ascii_digit() || c == '-' || c == '.'))
            })
            .count();
        self.i += len; // ASCII only: one byte a character
        if self.i == start {
            return self.err("a name expected");
        }
        Ok(self.s[start..self.i].to_string())
    }

    /// Character data up to `stop`, entities decoded; `<` and a bare `&` are errors.
    fn chars(&mut self, stop: char) -> Result<String, String> {
        let mut out = String::new();
        loop {
            let Some(c) = self.rest().chars().next() else {
                return Ok(out);
            };
            if c == stop {
                return Ok(out);
            }
            if c == '<' {
                return self.err("`<` in character data");
            }
            if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') {
                return self.err("a control character");
            }
            if self.rest().starts_with("]]>") {
                return self.err("`]]>` in character data");
            }
            if c == '&' {
                let end = self.rest().find(';').unwrap_or(0);
                let entity = &self.rest()[1..end.max(1)];
                let decoded = match entity {
                    "amp" => '&',
                    "lt" => '<',
                    "gt" => '>',
                    "quot" => '"',
                    "apos" => '\'',
                    e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16)
                        .ok()
                        .and_then(char::from_u32)
                        .ok_or(format!("bad character reference &{e};"))?,
                    e if e.starts_with('#') => e[1..]
                        .parse::<u32>()
                        .ok()
                        .and_then(char::from_u32)
                        .ok_or(format!("bad character reference &{e};"))?,
                    _ => return self.err("a bare `&` or an unknown entity"),
                };
                out.push(decoded);
                self.i += end + 1;
                continue;
            }
            out.push(c);
            self.i += c.len_utf8();
        }
    }

    fn element(&mut self) -> Result<Element, String> {
        if !self.eat("<") {
            return self.err("`<` expected");
        }
        let name = self.name()?;
        let mut attrs: Vec<(String, String)> = Vec::new();
        loop {
            let before = self.i;
            self.skip_ws();
            if self.eat("/>") {
                return Ok(Element {
                    name,
                    attrs,
                    children: Vec::new(),
                });
            }
            if self.eat(">") {
                break;
            }
            if self.i == before {
                return self.err("white space before an attribute expected");
            }
            let key = self.name()?;
            if attrs.iter().any(|(k, _)| *k == key) {
                return self.err(&format!("attribute {key} repeated"));
            }
            if !self.eat("=") {
                return self.err("`=` expected");
            }
            let quote = match self.rest().chars().next() {
                Some(q @ ('"' | '\'')) => q,
                _ => return self.err("a quoted attribute value expected"),
            };
            self.i += 1;
            let value = self.chars(quote)?;
            if !self.eat(&quote.to_string()) {
                return self.err("unterminated attribute value");
            }
            attrs.push((key, value));
        }
        let mut children = Vec::new();
        loop {
            if self.rest().is_empty() {
                return self.err(&format!("<{name}> not closed"));
            }
            if self.eat("</") {
                let end = self.name()?;
                if end != name {
                    return self.err(&format!("</{end}> closes <{name}>"));
                }
                self.skip_ws();
                if !self.eat(">") {
                    return self.err("`>` expected");
                }
                return Ok(Element {
                    name,
                    attrs,
                    children,
                });
            }
            if self.eat("<!--") {
                let Some(end) = self.rest().find("-->") else {
                    return self.err("unterminated comment");
                };
                self.i += end + 3;
                continue;
            }
            if self.rest().starts_with('<') {
                children.push(Node::Element(self.element()?));
            } else {
                let t = self.chars('<')?;
                children.push(Node::Text(t));
            }
        }
    }
}

/// Parses a whole document: an optional declaration, one root element, nothing after it.
fn parse_xml(s: &str) -> Result<Element, String> {
    let mut r = Reader { s, i: 0 };
    if r.eat("<?xml") {
        let Some(end) = r.rest().find("?>") else {
            return r.err("unterminated declaration");
        };
        r.i += end + 2;
    }
    r.skip_ws();
    let root = r.element()?;
    r.skip_ws();
    if !r.rest().is_empty() {
        return r.err("content after the root element");
    }
    Ok(root)
}

#[test]
fn the_xml_reader_rejects_what_is_not_well_formed() {
    for bad in [
        "",
        "<svg>",
        "<svg></g>",
        "<svg><g></svg></g>",
        "<svg a=1/>",
        "<svg a=\"1\" a=\"2\"/>",
        "<svg>a < b</svg>",
        "<svg>a & b</svg>",
        "<svg>&nbsp;</svg>",
        "<svg/><svg/>",
        "<svg>\u{1}</svg>",
        "text<svg/>",
        "<svg a=\"1\"b=\"2\"/>",
    ] {
        assert!(parse_xml(bad).is_err(), "{bad:?} is not well-formed");
    }
    let ok = parse_xml(
        "<?xml version=\"1.0\"?>\n<svg x='1' y=\"&lt;2&gt;\"><!-- c --><t>a &amp; &#x41;&#66;</t><g/></svg>\n",
    )
    .expect("well-formed");
    assert_eq!(ok.attr("y"), Some("<2>"));
    assert_eq!(ok.elements().next().unwrap().text(), "a & AB");
}

// ---------------------------------------------------------------------------------------
// The chart, read back.

/// One series of a panel: its title (the category), fill colour, and polygon points.
type Series = (String, String, Vec<(f64, f64)>);

/// One panel: its title, series, and axis ticks (y, label).
#[derive(Debug)]
struct Panel {
    title: String,
    series: Vec<Series>,
    ticks: Vec<(f64, String)>,
}

impl Panel {
    fn names(&self) -> Vec<&str> {
        self.series.iter().map(|s| s.0.as_str()).collect()
    }

    /// The y of the `0 B` tick (the baseline) and of the top tick, and the top tick's label.
    fn scale(&self) -> (f64, f64, &str) {
        let bottom = self.ticks.first().expect("ticks");
        let top = self.ticks.last().expect("ticks");
        assert_eq!(bottom.1, "0 B");
        (bottom.0, top.0, top.1.as_str())
    }

    /// The top edge of the stack, one point per column (the last series' upper half).
    fn top_edge(&self) -> &[(f64, f64)] {
        let pts = &self.series.last().expect("a series").2;
        &pts[..pts.len() / 2]
    }
}

struct Chart {
    root: Element,
    panels: Vec<Panel>,
}

fn points(s: &str) -> Vec<(f64, f64)> {
    s.split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').expect("x,y");
            (x.parse().expect("x"), y.parse().expect("y"))
        })
        .collect()
}

fn read_chart(svg: &str) -> Chart {
    let root = parse_xml(svg).unwrap_or_else(|e| panic!("well-formed XML: {e}\n{svg}"));
    assert_eq!(root.name, "svg");
    assert_eq!(root.attr("xmlns"), Some("http://www.w3.org/2000/svg"));
    let mut panels: Vec<Panel> = Vec::new();
    let mut lines: Vec<f64> = Vec::new();
    for e in root.elements() {
        match e.name.as_str() {
            "text" if e.attr("font-weight") == Some("bold") => panels.push(Panel {
                title: e.text(),
                series: Vec::new(),
                ticks: Vec::new(),
            }),
            "polygon" => {
                let p = panels.last_mut().expect("a series inside a panel");
                let title = e
                    .elements()
                    .find(|c| c.name == "title")
                    .map(|c| c.text())
                    .expect("a series names its category");
                p.series.push((
                    title,
                    e.attr("fill").expect("fill").to_string(),
                    points(e.attr("points").expect("points")),
                ));
            }
            "line" => lines.push(e.attr("y1").unwrap().parse().unwrap()),
            "text" if e.attr("text-anchor") == Some("end") => {
                let y: f64 = lines.pop().expect("a tick's grid line");
                let label_y: f64 = e.attr("y").unwrap().parse().unwrap();
                assert!((label_y - y - 3.0).abs() < 1e-9, "label beside its line");
                panels
                    .last_mut()
                    .expect("ticks inside a panel")
                    .ticks
                    .push((y, e.text()));
            }
            _ => {}
        }
    }
    // everything drawn lies on the canvas, and the panels do not overlap
    let size = |k: &str| -> f64 { root.attr(k).expect(k).parse().expect(k) };
    let (w, h) = (size("width"), size("height"));
    for p in &panels {
        for (_, _, pts) in &p.series {
            assert!(
                pts.iter()
                    .all(|&(x, y)| (0.0..=w).contains(&x) && (0.0..=h).contains(&y)),
                "{}: on the canvas",
                p.title
            );
        }
    }
    for pair in panels.windows(2) {
        let lowest = pair[0].ticks.first().map_or(0.0, |t| t.0);
        let highest = pair[1].ticks.last().map_or(h, |t| t.0);
        assert!(
            lowest < highest,
            "{} above {}",
            pair[0].title,
            pair[1].title
        );
    }
    Chart { root, panels }
}

impl Chart {
    fn panel(&self, domain: &str) -> &Panel {
        self.panels
            .iter()
            .find(|p| p.title.starts_with(&format!("{domain} memory (")))
            .unwrap_or_else(|| panic!("a {domain} panel"))
    }

    /// The legend's category names.
    fn legend(&self) -> Vec<String> {
        self.root
            .elements()
            .filter(|e| e.name == "text" && e.attr("font-size") == Some("11"))
            .map(|e| e.text())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Timelines built by hand.

const MIB: u64 = 1 << 20;

fn sample(
    phase: Phase,
    step: u64,
    device: &[(Category, u64)],
    host: &[(Category, u64)],
    file_rss: u64,
) -> Sample {
    let mut s = Sample::new(phase, step);
    for &(c, b) in device {
        s.device.categories.set(c, b);
    }
    s.device.reserved = s.device.categories.total();
    s.device.allocated = s.device.categories.live();
    for &(c, b) in host {
        s.host.categories.set(c, b);
    }
    s.host.anon_rss = s.host.categories.total();
    s.host.file_rss = file_rss;
    s
}

/// Four samples: device parameters, gradients, activations and cache (peak 3 GiB at the
/// backward sample), host input and other bytes plus page cache (peak 40 MiB).
fn hand_timeline(name: &str) -> Timeline {
    use Category::*;
    let mut t = Timeline::new(
        Source::Simulated,
        TimelineMeta {
            name: name.into(),
            ..TimelineMeta::default()
        },
    );
    t.push(sample(Phase::Start, 0, &[], &[(Other, 4 * MIB)], 0));
    t.push(sample(
        Phase::ModelInit,
        0,
        &[(Parameter, 1024 * MIB)],
        &[(Other, 4 * MIB)],
        0,
    ));
    t.push(sample(
        Phase::Forward,
        0,
        &[
            (Parameter, 1024 * MIB),
            (Activation, 1536 * MIB),
            (Cache, 256 * MIB),
        ],
        &[(Other, 4 * MIB), (Input, 16 * MIB)],
        8 * MIB,
    ));
    t.push(sample(
        Phase::Backward,
        0,
        &[
            (Parameter, 1024 * MIB),
            (Gradient, 1024 * MIB),
            (Activation, 512 * MIB),
            (Cache, 512 * MIB),
        ],
        &[(Other, 4 * MIB), (Input, 16 * MIB)],
        20 * MIB,
    ));
    t
}

fn totals(t: &Timeline) -> (Vec<u64>, Vec<u64>) {
    let dev = t.samples.iter().map(|s| s.device.reserved).collect();
    let host = t.samples.iter().map(|s| s.host.rss()).collect();
    (dev, host)
}

/// Maps each column's stack top back to bytes on the panel's axis and compares it with the
/// sample totals (to the 0.1 px the coordinates are written with).
fn check_extent(p: &Panel, want: &[u64]) {
    let peak = *want.iter().max().unwrap();
    let (base, top, label) = p.scale();
    assert_eq!(label, human(peak), "{}: the top tick is the peak", p.title);
    let edge = p.top_edge();
    assert_eq!(edge.len(), want.len(), "{}: one point per sample", p.title);
    let px = (base - top) / peak as f64; // pixels per byte
    for (k, (&(_, y), &w)) in edge.iter().zip(want).enumerate() {
        let bytes = (base - y) / px;
        assert!(
            (bytes - w as f64).abs() <= 0.06 / px,
            "{} column {k}: plotted {bytes:.0} B, the sample holds {w} B",
            p.title
        );
    }
    // the peak's point is at the top of the axis
    let i = want.iter().position(|&w| w == peak).unwrap();
    assert_eq!(edge[i].1, top, "{}: the peak touches the top tick", p.title);
    // x runs left to right, one column per sample
    assert!(edge.windows(2).all(|w| w[1].0 > w[0].0), "{}", p.title);
}

#[test]
fn a_hand_timeline_draws_one_series_per_category_present() {
    let t = hand_timeline("hand");
    let chart = read_chart(&render_svg(&t));
    assert_eq!(chart.panels.len(), 2);
    let dev = chart.panel("device");
    assert_eq!(dev.title, "device memory (simulated)");
    assert_eq!(
        dev.names(),
        ["parameter", "gradient", "activation", "cache"],
        "device series, stacked in category order; none for optimizer_state, input, ..."
    );
    for (name, fill, _) in &dev.series {
        let c = Category::from_name(name).unwrap();
        assert_eq!(fill, colour(c), "{name}");
    }
    let host = chart.panel("host");
    assert_eq!(host.names(), ["input", "other", "page cache (file RSS)"]);
    assert_eq!(host.series[0].1, colour(Category::Input));
    // the legend names every category
    let legend = chart.legend();
    let all: Vec<&str> = Category::ALL.iter().map(|c| c.name()).collect();
    assert_eq!(legend, all);
}

#[test]
fn axis_labels_are_bytes_and_the_top_is_the_peak() {
    let t = hand_timeline("hand");
    let chart = read_chart(&render_svg(&t));
    let labels = |p: &Panel| -> Vec<String> { p.ticks.iter().map(|t| t.1.clone()).collect() };
    // 3 GiB of device memory at the peak, in quarters
    assert_eq!(
        labels(chart.panel("device")),
        ["0 B", "768.00 MiB", "1.50 GiB", "2.25 GiB", "3.00 GiB"]
    );
    // host: 20 MiB of categories + 20 MiB of page cache
    assert_eq!(
        labels(chart.panel("host")),
        ["0 B", "10.00 MiB", "20.00 MiB", "30.00 MiB", "40.00 MiB"]
    );
    // ticks go up the page, evenly
    for p in &chart.panels {
        let ys: Vec<f64> = p.ticks.iter().map(|t| t.0).collect();
        let step = ys[0] - ys[1];
        assert!(step > 0.0);
        assert!(ys.windows(2).all(|w| ((w[0] - w[1]) - step).abs() < 0.11));
    }
}

#[test]
fn the_stack_top_follows_the_sample_totals() {
    let t = hand_timeline("hand");
    let chart = read_chart(&render_svg(&t));
    let (dev, host) = totals(&t);
    check_extent(chart.panel("device"), &dev);
    check_extent(chart.panel("host"), &host);
    // each series starts where the one below it ends
    for p in &chart.panels {
        for w in p.series.windows(2) {
            let below = &w[0].2;
            let above = &w[1].2;
            let n = below.len() / 2;
            let below_top = &below[..n];
            let mut above_base: Vec<(f64, f64)> = above[n..].to_vec();
            above_base.reverse();
            assert_eq!(
                below_top,
                &above_base[..],
                "{}: {} on {}",
                p.title,
                w[1].0,
                w[0].0
            );
        }
        // the lowest series stands on the baseline
        let (base, _, _) = p.scale();
        let first = &p.series[0].2;
        assert!(first[first.len() / 2..].iter().all(|&(_, y)| y == base));
    }
}

#[test]
fn the_name_is_escaped() {
    let t = hand_timeline("a <b> & \"c\" ]]> \u{7}");
    let svg = render_svg(&t);
    let chart = read_chart(&svg);
    let title = chart
        .root
        .elements()
        .find(|e| e.name == "text")
        .unwrap()
        .text();
    assert_eq!(
        title,
        "trainmem: a <b> & \"c\" ]]> \u{fffd} (4 samples; x = phase boundaries in order)"
    );
}

#[test]
fn a_long_timeline_keeps_its_peak() {
    let mut t = Timeline::new(Source::Measured, TimelineMeta::default());
    for i in 0..10_000u64 {
        let act = if i == 7_777 { 900 * MIB } else { MIB + i % 7 };
        t.push(sample(
            Phase::Forward,
            i,
            &[
                (Category::Parameter, 100 * MIB),
                (Category::Activation, act),
            ],
            &[(Category::Other, MIB)],
            0,
        ));
    }
    let chart = read_chart(&render_svg(&t));
    let dev = chart.panel("device");
    assert_eq!(dev.title, "device memory (measured)");
    let edge = dev.top_edge();
    assert!(edge.len() <= 1500, "{} columns", edge.len());
    assert!(edge.len() > 1000, "{} columns", edge.len());
    let (_, top, label) = dev.scale();
    assert_eq!(label, human(1000 * MIB));
    assert_eq!(
        edge.iter().filter(|p| p.1 == top).count(),
        1,
        "the spike survives the reduction, once"
    );
}

#[test]
fn an_empty_panel_has_no_series_and_no_byte_scale() {
    // a CPU run measured on the host: nothing on the device
    let mut t = Timeline::new(Source::Measured, TimelineMeta::default());
    for i in 0..3 {
        t.push(sample(
            Phase::Forward,
            i,
            &[],
            &[(Category::Parameter, 5 * MIB)],
            0,
        ));
    }
    let chart = read_chart(&render_svg(&t));
    let dev = chart.panel("device");
    assert!(dev.series.is_empty());
    let labels: Vec<&str> = dev.ticks.iter().map(|t| t.1.as_str()).collect();
    assert_eq!(labels, ["0 B"], "no scale is made up for an empty panel");
    assert_eq!(chart.panel("host").names(), ["parameter"]);

    // no samples at all: still a well-formed chart
    let t = Timeline::new(Source::Simulated, TimelineMeta::default());
    let chart = read_chart(&render_svg(&t));
    assert!(chart.panels.iter().all(|p| p.series.is_empty()));
}

#[test]
fn a_simulated_plan_charts_its_timeline() {
    let plan = Plan::from_toml_str(
        "name = \"svg\"\n\
         [model.mlp]\ninput = 512\nhidden = [1024, 1024]\noutput = 10\nloss = \"cross_entropy\"\n\
         [training]\nbatch_size = 64\nepochs = 2\nsteps_per_epoch = 4\ncheckpoint_every = 3\n\
         [optimizer]\nkind = \"adam\"\n\
         [data]\nsamples = 256\nstorage = \"mmap\"\n\
         [loader]\nworkers = 2\n\
         [device]\ncapacity = \"4GiB\"\n",
    )
    .expect("plan");
    let r = trainmem_sim::simulate(&plan, SimOptions::default()).expect("simulates");
    let t = &r.timeline;
    let svg = render_svg(t);
    let chart = read_chart(&svg);

    // one series per category that holds device bytes at some sample
    let present: Vec<&str> = Category::ALL
        .into_iter()
        .filter(|&c| t.samples.iter().any(|s| s.device.categories.get(c) > 0))
        .map(|c| c.name())
        .collect();
    let dev = chart.panel("device");
    assert_eq!(dev.names(), present);
    for c in [
        "parameter",
        "gradient",
        "optimizer_state",
        "activation",
        "cache",
    ] {
        assert!(present.contains(&c), "{c} in {present:?}");
    }
    // the device axis tops out at the highest reserved memory of a sample
    let (dev_totals, host_totals) = totals(t);
    check_extent(dev, &dev_totals);
    // host: categories and page cache add up to the RSS the simulator predicts
    check_extent(chart.panel("host"), &host_totals);
    assert_eq!(
        *host_totals.iter().max().unwrap(),
        t.peak_host_rss().unwrap().bytes
    );
    assert!(
        chart
            .panel("host")
            .names()
            .contains(&"page cache (file RSS)")
    );
    assert!(svg.contains(&format!("trainmem: svg ({} samples;", t.samples.len())));
}
