//! `[data] storage` accepts the memory-mapped file formats trainmem-loader reads (token files,
//! indexed token data sets, Arrow, safetensors), and the host-memory model charges them as a
//! memory map: page cache growing with the bytes read, no anonymous memory for the data set.

use trainmem_core::Plan;
use trainmem_core::plan::DataStorage;
use trainmem_sim::{SimOptions, simulate};

fn plan(storage: &str) -> Plan {
    Plan::from_toml_str(&format!(
        "name = \"storage\"\n\
         [model.mlp]\ninput = 512\nhidden = [1024]\noutput = 10\nloss = \"cross_entropy\"\n\
         [training]\nbatch_size = 64\nepochs = 1\nsteps_per_epoch = 4\n\
         [data]\nsamples = 256\nstorage = \"{storage}\"\n\
         [loader]\nworkers = 2\n\
         [device]\ncapacity = \"4GiB\"\n"
    ))
    .expect("plan")
}

fn host(storage: &str) -> Vec<(u64, u64)> {
    let r = simulate(&plan(storage), SimOptions::default()).expect("simulates");
    r.timeline
        .samples
        .iter()
        .map(|s| (s.host.anon_rss, s.host.file_rss))
        .collect()
}

#[test]
fn mapped_formats_parse_and_cost_page_cache_like_mmap() {
    let mmap = host("mmap");
    let preload = host("preload");
    assert!(mmap.iter().any(|&(_, file)| file > 0), "mmap reads pages");
    for (name, kind) in [
        ("tokens", DataStorage::Tokens),
        ("indexed", DataStorage::Indexed),
        ("arrow", DataStorage::Arrow),
        ("safetensors", DataStorage::Safetensors),
    ] {
        assert_eq!(plan(name).data.storage, kind);
        assert!(kind.is_memory_mapped());
        assert_eq!(host(name), mmap, "{name} is modelled as a memory map");
        assert_ne!(host(name), preload);
    }
    assert!(!DataStorage::Preload.is_memory_mapped());
    assert!(!DataStorage::Stream.is_memory_mapped());
}

#[test]
fn an_unknown_storage_is_still_an_error() {
    assert!(
        Plan::from_toml_str(
            "name = \"x\"\n[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n[data]\nstorage = \"parquet\"\n"
        )
        .is_err()
    );
}
