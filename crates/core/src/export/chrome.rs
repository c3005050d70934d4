//! Chrome trace-event format: one counter track per domain with one series per category
//! (a stacked area chart in Perfetto and chrome://tracing), plus instant events naming the
//! phases. Timestamps are one millisecond per sample.

use crate::Category;
use serde_json::{Map, Value, json};

use super::ExportError;
use crate::timeline::Timeline;

/// The trace as a JSON string (`{"traceEvents": [...], "displayTimeUnit": "ms"}`).
pub fn chrome_trace(t: &Timeline) -> Result<String, ExportError> {
    let mut ev = vec![
        json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": format!("device ({})", t.source)}}),
        json!({"name": "process_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": format!("host ({})", t.source)}}),
    ];
    for (i, s) in t.samples.iter().enumerate() {
        let ts = i as u64 * 1000;
        let mut dev = Map::new();
        let mut host = Map::new();
        for c in Category::ALL {
            dev.insert(c.name().into(), Value::from(s.device.categories.get(c)));
            if c != Category::Cache {
                host.insert(c.name().into(), Value::from(s.host.categories.get(c)));
            }
        }
        host.insert("page_cache".into(), Value::from(s.host.file_rss));
        ev.push(json!({"name": "device memory (bytes)", "ph": "C", "ts": ts, "pid": 1, "tid": 0, "args": dev}));
        ev.push(json!({"name": "host memory (bytes)", "ph": "C", "ts": ts, "pid": 2, "tid": 0, "args": host}));
        ev.push(json!({
            "name": s.phase.name(), "ph": "i", "s": "p", "ts": ts, "pid": 1, "tid": 0,
            "args": {"step": s.step, "epoch": s.epoch, "allocated": s.device.allocated, "reserved": s.device.reserved}
        }));
    }
    Ok(serde_json::to_string(
        &json!({"traceEvents": ev, "displayTimeUnit": "ms"}),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Phase, Sample, Source, TimelineMeta};

    #[test]
    fn one_counter_series_per_category() {
        let mut t = Timeline::new(Source::Simulated, TimelineMeta::default());
        let mut s = Sample {
            phase: Phase::Forward,
            step: 0,
            epoch: 0,
            micro_batch: None,
            time_us: 0.0,
            host: Default::default(),
            device: Default::default(),
        };
        s.device.categories.set(Category::Activation, 7);
        t.push(s);
        let v: Value = serde_json::from_str(&chrome_trace(&t).unwrap()).unwrap();
        let evs = v["traceEvents"].as_array().unwrap();
        let c = evs
            .iter()
            .find(|e| e["ph"] == "C" && e["pid"] == 1)
            .unwrap();
        assert_eq!(c["args"]["activation"], 7);
        assert_eq!(c["args"].as_object().unwrap().len(), 8);
    }
}
