//! The twin's live tensors at the highest total of forward and of backward for one recorded
//! PyTorch run, to set beside `validation/pytorch/record.py --explain NAME`:
//!
//! ```sh
//! cargo run -p trainmem-sim --example twin_peaks -- fixtures/pytorch/autocast-bert-tiny-adamw.json
//! ```

use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(path) = std::env::args().nth(1) else {
        return Err("usage: twin_peaks RECORDING.json".into());
    };
    let rec = trainmem_sim::validation::load(path.as_ref())?;
    for peak in trainmem_sim::validation::twin_peaks(&rec)? {
        println!(
            "{}: {} B live at the highest total during {} (model state left out)",
            rec.name, peak.total, peak.pass
        );
        let mut rows: BTreeMap<(u64, &str, &str, String), u32> = BTreeMap::new();
        for t in &peak.tensors {
            *rows
                .entry((t.bytes, t.category.name(), t.pass, t.layer.clone()))
                .or_default() += 1;
        }
        for ((bytes, category, pass, layer), n) in rows.iter().rev() {
            println!("  {n:>3} × {bytes:>10} {category:<16} {pass:<9} {layer}");
        }
    }
    Ok(())
}
