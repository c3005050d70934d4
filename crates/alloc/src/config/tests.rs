//! Tests of the configuration: PyTorch's parser's vectors, every option it accepts, the
//! `>` rules, clamping, and the parse → display → parse round trip.

use super::*;
use proptest::prelude::*;

fn reparsed(c: &AllocatorConfig) -> AllocatorConfig {
    AllocatorConfig::parse(&c.to_string())
        .unwrap_or_else(|e| panic!("`{c}` does not parse back: {e}"))
}

#[test]
fn non_split_rounding_builder_takes_mib_and_refuses_under_twenty() {
    let c = AllocatorConfig::default()
        .with_max_non_split_rounding_mb(64)
        .unwrap();
    assert_eq!(c.max_non_split_rounding(), 64 * MIB);
    assert!(
        AllocatorConfig::default()
            .with_max_non_split_rounding_mb(19)
            .is_err()
    );
}

#[test]
fn parses_full_string() {
    let c = AllocatorConfig::parse(
        "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8",
    )
    .unwrap();
    assert_eq!(c.max_split_size(), Some(128 * MIB));
    assert_eq!(c.roundup_power2_divisions().divisions_for(1200), 4);
    assert_eq!(c.garbage_collection_threshold(), Some(0.8));
    assert_eq!(c.max_non_split_rounding(), 20 * MIB);
    assert_eq!(reparsed(&c), c);
}

#[test]
fn whitespace_is_ignored_everywhere_as_pytorch_ignores_it() {
    let c = AllocatorConfig::parse(" max_split _size_mb : 1 28 ,\texpandable_segments: True\n")
        .unwrap();
    assert_eq!(c.max_split_size(), Some(128 * MIB));
    assert!(c.expandable_segments());
}

#[test]
fn empty_is_default() {
    assert_eq!(
        AllocatorConfig::parse("").unwrap(),
        AllocatorConfig::default()
    );
    assert_eq!(
        AllocatorConfig::parse("expandable_segments:False,backend:native").unwrap(),
        AllocatorConfig::default()
    );
}

/// The vectors of PyTorch's own unit test of its parser
/// (`c10/test/core/AllocatorConfig_test.cpp`), looked up by size as PyTorch looks them up.
#[test]
fn interval_lists_read_as_current_pytorch_reads_them() {
    let d = RoundupPower2Divisions::parse("[64:8,128:2,256:4,512:2,1024:4,>:1]").unwrap();
    for (mb, want) in [
        (32, 8),
        (64, 8),
        (128, 2),
        (256, 4),
        (512, 2),
        (1024, 4),
        (2048, 1),
        (4096, 1),
        (8192, 1),
    ] {
        assert_eq!(d.divisions_for(mb * MIB), want, "{mb} MB");
    }
    let d = RoundupPower2Divisions::parse("[128:8,256:16,512:1,2048:8,>:2]").unwrap();
    for (mb, want) in [
        (64, 8),
        (128, 8),
        (256, 16),
        (512, 1),
        (1024, 0),
        (2048, 8),
        (4096, 2),
    ] {
        assert_eq!(d.divisions_for(mb * MIB), want, "{mb} MB");
    }
}

#[test]
fn greater_than_fills_after_or_from_the_last_listed_interval() {
    let list = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]";
    let now = AllocatorConfig::parse(list).unwrap();
    let d = now.roundup_power2_divisions().intervals();
    // Entries below the first bound take its value; `>` fills after the last bound.
    assert_eq!(&d[..9], &[1; 9]);
    assert_eq!((d[9], d[10]), (2, 4));
    assert_eq!(&d[11..], &[8; 5]);
    // Older PyTorch: `>` starts at the last bound's own interval and overwrites its 4.
    let old = AllocatorConfig::parse_with(list, GreaterThanFill::FromLastListed).unwrap();
    let o = old.roundup_power2_divisions().intervals();
    assert_eq!(&o[..10], &d[..10]);
    assert_eq!(o[10], 8);
    assert_eq!(&o[11..], &d[11..]);
    assert_eq!(
        crate::round_size(1100 * MIB, old.roundup_power2_divisions()),
        Some(1152 * MIB)
    );
    assert_eq!(
        crate::round_size(1100 * MIB, now.roundup_power2_divisions()),
        Some(1280 * MIB)
    );
    // `>` alone: all intervals but the first now, all 16 before.
    let alone = RoundupPower2Divisions::parse("[>:8]").unwrap();
    assert_eq!(alone.intervals()[0], 0);
    assert_eq!(&alone.intervals()[1..], &[8; 15]);
    let alone_old =
        RoundupPower2Divisions::parse_with("[>:8]", GreaterThanFill::FromLastListed).unwrap();
    assert_eq!(alone_old, RoundupPower2Divisions::uniform(8));
    // Both configurations write themselves out as the same 16-entry list either rule reads.
    for c in [&now, &old] {
        assert_eq!(reparsed(c), *c);
        let back = AllocatorConfig::parse_with(&c.to_string(), GreaterThanFill::FromLastListed);
        assert_eq!(back.as_ref(), Ok(c));
    }
}

#[test]
fn interval_list_edge_cases() {
    let p = RoundupPower2Divisions::parse;
    // PyTorch's tokenizer reads `[]` as nothing and a trailing comma as the end.
    assert_eq!(p("[]").unwrap(), RoundupPower2Divisions::default());
    assert_eq!(p("[256:4,]").unwrap(), p("[256:4]").unwrap());
    assert_eq!(
        p(" [ 2 56 : 4 , > : 2 ] ").unwrap(),
        p("[256:4,>:2]").unwrap()
    );
    // Bounds past 32 GiB all land in the last interval; 0 divisions turn rounding off.
    assert_eq!(
        p("[1048576:4]").unwrap(),
        RoundupPower2Divisions::uniform(4)
    );
    assert_eq!(p("[1:0,>:4]").unwrap().intervals()[0], 0);
    for bad in [
        "[,]",
        "[256:1,,]",
        "[0:1]",
        "[3:1]",
        "[256:3]",
        "[256:1",
        "[a:1]",
        "[256]",
    ] {
        assert!(p(bad).is_err(), "{bad}");
    }
    assert!(p("0").is_err(), "the single form must be a power of two");
    assert_eq!(p("1").unwrap(), RoundupPower2Divisions::uniform(1));
    assert_eq!(p("4").unwrap().to_string(), "4");
    assert_eq!(RoundupPower2Divisions::default().to_string(), "[]");
    assert_eq!("[2:2]".parse::<RoundupPower2Divisions>(), p("[2:2]"));
}

#[test]
fn expandable_segments_round_trip() {
    let c = AllocatorConfig::parse("max_split_size_mb:128,expandable_segments:True").unwrap();
    assert!(c.expandable_segments());
    assert_eq!(
        c.to_string(),
        "max_split_size_mb:128,expandable_segments:True"
    );
    assert_eq!(reparsed(&c), c);
    assert!(
        !AllocatorConfig::parse("expandable_segments:False")
            .unwrap()
            .expandable_segments()
    );
    assert!(
        AllocatorConfig::default()
            .with_expandable_segments(true)
            .expandable_segments()
    );
}

#[test]
fn rejects_bad_input() {
    let e = AllocatorConfig::parse("max_split_size_mb:10").unwrap_err();
    assert!(
        matches!(&e, ConfigError::InvalidValue { key, value, .. } if key == "max_split_size_mb" && value == "10")
    );
    assert!(e.to_string().contains("max_split_size_mb"));
    let e = AllocatorConfig::parse("max_split_size_mb:abc").unwrap_err();
    assert!(e.to_string().contains("abc"));
    let e = AllocatorConfig::parse("frobnicate:3").unwrap_err();
    assert_eq!(
        e,
        ConfigError::UnknownKey {
            key: "frobnicate".into()
        }
    );
    assert!(e.to_string().contains("pinned_num_register_threads"), "{e}");
    let e = AllocatorConfig::parse("backend:cudaMallocAsync").unwrap_err();
    assert!(matches!(e, ConfigError::Unsupported { .. }));
    assert!(e.to_string().contains("not supported"));
    for bad in [
        "expandable_segments:maybe",
        // PyTorch takes only `True` and `False`.
        "expandable_segments:true",
        "expandable_segments:TRUE",
        "expandable_segments:1",
        "garbage_collection_threshold:1.0",
        "garbage_collection_threshold:0",
        "garbage_collection_threshold:NaN",
        "garbage_collection_threshold:inf",
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:[300:2]",
        "roundup_power2_divisions:[256:3]",
        "roundup_power2_divisions:[256:2",
        "max_split_size_mb",
        "max_split_size_mb:-1",
        "max_split_size_mb:128MB",
        "max_split_size_mb:99999999999999999999999",
        "backend:foo",
    ] {
        assert!(AllocatorConfig::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn huge_sizes_clamp_as_pytorch_clamps_and_round_trip() {
    // PyTorch clamps the MB count to SIZE_MAX / 1 MiB before multiplying.
    for mb in [u64::MAX, 1 << 44, (1 << 44) - 1] {
        let c = AllocatorConfig::parse(&format!("max_split_size_mb:{mb}")).unwrap();
        assert_eq!(c.max_split_size(), Some(MAX_MB * MIB), "{mb}");
        assert_eq!(c.to_string(), format!("max_split_size_mb:{MAX_MB}"));
        assert_eq!(reparsed(&c), c);
        let c = AllocatorConfig::parse(&format!("max_non_split_rounding_mb:{mb}")).unwrap();
        assert_eq!(c.max_non_split_rounding(), MAX_MB * MIB);
        assert_eq!(reparsed(&c), c);
    }
    let b = AllocatorConfig::default()
        .with_max_split_size_mb(u64::MAX)
        .unwrap();
    assert_eq!(b.max_split_size(), Some(MAX_MB * MIB));
    assert_eq!(reparsed(&b), b);
}

#[test]
fn fractions_are_written_exactly_and_briefly() {
    for t in ["1e-300", "5e-324", "0.8", "0.9999999999999999", "1.234e-5"] {
        let c = AllocatorConfig::parse(&format!("garbage_collection_threshold:{t}")).unwrap();
        let s = c.to_string();
        assert!(s.len() < 60, "{s}");
        assert_eq!(reparsed(&c), c, "{t}");
    }
    let c = AllocatorConfig::parse("garbage_collection_threshold:1e-300").unwrap();
    assert_eq!(c.to_string(), "garbage_collection_threshold:1e-300");
    let c = AllocatorConfig::parse("garbage_collection_threshold:0.8").unwrap();
    assert_eq!(c.to_string(), "garbage_collection_threshold:0.8");
}

#[test]
fn accepts_every_option_of_pytorchs_cuda_allocator() {
    let all = "backend:native,max_split_size_mb:256,max_non_split_rounding_mb:40,\
               roundup_power2_divisions:[256:1,512:2,>:4],garbage_collection_threshold:0.6,\
               expandable_segments:True,per_process_memory_fraction:0.5,\
               large_segment_size_mb:20,release_lock_on_cudamalloc:True,\
               pinned_use_cuda_host_register:True,pinned_num_register_threads:8,\
               pinned_use_background_threads:True,pinned_reserve_segment_size_mb:64,\
               pinned_max_round_threshold_mb:32,pinned_max_cached_size_mb:1024,\
               graph_capture_record_stream_reuse:True";
    let c = AllocatorConfig::parse(all).unwrap();
    assert_eq!(c.max_split_size(), Some(256 * MIB));
    assert_eq!(c.per_process_memory_fraction(), 0.5);
    assert!(c.release_lock_on_cudamalloc());
    assert!(c.pinned_use_cuda_host_register());
    assert_eq!(c.pinned_num_register_threads(), 8);
    assert!(c.pinned_use_background_threads());
    assert_eq!(c.pinned_reserve_segment_size_mb(), 64);
    assert_eq!(c.pinned_max_round_threshold_mb(), Some(32));
    assert_eq!(c.pinned_max_cached_size_mb(), Some(1024));
    assert!(c.graph_capture_record_stream_reuse());
    assert_eq!(reparsed(&c), c);
    for key in [
        "release_lock_on_cudamalloc:True",
        "pinned_use_cuda_host_register:True",
        "pinned_num_register_threads:8",
        "per_process_memory_fraction:0.5",
    ] {
        assert!(c.to_string().contains(key), "{key} in {c}");
    }
    // ROCm spellings are read as their CUDA names.
    let r =
        AllocatorConfig::parse("release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True")
            .unwrap();
    assert!(r.release_lock_on_cudamalloc() && r.pinned_use_cuda_host_register());
    // False and the defaults change nothing.
    let off = "release_lock_on_cudamalloc:False,pinned_use_cuda_host_register:False,\
               pinned_num_register_threads:1,pinned_use_background_threads:False,\
               graph_capture_record_stream_reuse:False,per_process_memory_fraction:1.0";
    assert_eq!(
        AllocatorConfig::parse(off).unwrap(),
        AllocatorConfig::default()
    );
}

#[test]
fn options_outside_the_model_are_checked_as_pytorch_checks_them() {
    for bad in [
        "release_lock_on_cudamalloc:yes",
        "pinned_use_cuda_host_register:true",
        "pinned_num_register_threads:0",
        "pinned_num_register_threads:3",
        "pinned_num_register_threads:256",
        "pinned_use_background_threads:1",
        "pinned_reserve_segment_size_mb:0",
        "pinned_max_cached_size_mb:-5",
        "graph_capture_record_stream_reuse:on",
        "per_process_memory_fraction:1.5",
        "per_process_memory_fraction:-0.1",
        "per_process_memory_fraction:NaN",
        "large_segment_size_mb:10",
    ] {
        let e = AllocatorConfig::parse(bad).unwrap_err();
        assert!(matches!(e, ConfigError::InvalidValue { .. }), "{bad}: {e}");
    }
    assert_eq!(
        AllocatorConfig::parse("pinned_num_register_threads:128")
            .unwrap()
            .pinned_num_register_threads(),
        128
    );
    // Only PyTorch's default large segment is modelled.
    let e = AllocatorConfig::parse("large_segment_size_mb:12").unwrap_err();
    assert!(matches!(e, ConfigError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("20 MiB"), "{e}");
    assert_eq!(
        AllocatorConfig::parse("large_segment_size_mb:20").unwrap(),
        AllocatorConfig::default()
    );
    assert!(
        AllocatorConfig::default()
            .with_per_process_memory_fraction(1.5)
            .is_err()
    );
}

#[test]
fn reads_the_environment_in_pytorchs_order() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(
        AllocatorConfig::from_env_with(env(&[])).unwrap(),
        AllocatorConfig::default()
    );
    let c = AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")]))
        .unwrap();
    assert_eq!(c.max_split_size(), Some(64 * MIB));
    let c = AllocatorConfig::from_env_with(env(&[
        ("PYTORCH_ALLOC_CONF", "max_split_size_mb:64"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ]))
    .unwrap();
    assert!(c.expandable_segments());
    assert_eq!(c.max_split_size(), None);
    // Set but empty: the defaults, without looking further.
    let c = AllocatorConfig::from_env_with(env(&[
        ("PYTORCH_CUDA_ALLOC_CONF", ""),
        ("PYTORCH_ALLOC_CONF", "max_split_size_mb:64"),
    ]))
    .unwrap();
    assert_eq!(c, AllocatorConfig::default());
    assert!(AllocatorConfig::from_env_with(env(&[("PYTORCH_HIP_ALLOC_CONF", "bogus:1")])).is_err());
}

#[test]
fn builder() {
    let c = AllocatorConfig::default()
        .with_max_split_size_mb(64)
        .unwrap()
        .with_roundup_power2_divisions(RoundupPower2Divisions::uniform(2));
    assert_eq!(c.max_split_size(), Some(64 * MIB));
    assert!(
        AllocatorConfig::default()
            .with_max_split_size_mb(19)
            .is_err()
    );
    assert!(
        AllocatorConfig::default()
            .with_garbage_collection_threshold(1.5)
            .is_err()
    );
    assert!(RoundupPower2Divisions::from_intervals([3; ROUNDUP_INTERVALS]).is_err());
}

/// One valid `key:value` option as a user might write it.
fn option() -> impl Strategy<Value = String> {
    let power = |max: u32| (0..=max).prop_map(|e| 1u64 << e);
    let bool_word = prop_oneof![Just("True"), Just("False")];
    let fraction = prop_oneof![
        (1u64..1_000_000).prop_map(|k| k as f64 / 1_000_000.0),
        // any float strictly between 0 and 1, subnormals included
        (1u64..0x3FF0_0000_0000_0000).prop_map(f64::from_bits),
    ];
    let text = |x: f64, sci: bool| if sci { format!("{x:e}") } else { x.to_string() };
    let entry = prop_oneof![
        (power(20), prop_oneof![Just(0u64), power(10)]).prop_map(|(b, d)| format!("{b}:{d}")),
        prop_oneof![Just(0u64), power(10)].prop_map(|d| format!(">:{d}")),
    ];
    let list = (proptest::collection::vec(entry, 0..6), any::<bool>()).prop_map(|(e, comma)| {
        let trailing = if comma && !e.is_empty() { "," } else { "" };
        format!("[{}{trailing}]", e.join(","))
    });
    prop_oneof![
        (20u64..=u64::MAX).prop_map(|m| format!("max_split_size_mb:{m}")),
        (20u64..5000).prop_map(|m| format!("max_split_size_mb:{m}")),
        (20u64..=u64::MAX).prop_map(|m| format!("max_non_split_rounding_mb:{m}")),
        power(63).prop_map(|d| format!("roundup_power2_divisions:{d}")),
        list.prop_map(|l| format!("roundup_power2_divisions:{l}")),
        (fraction.clone(), any::<bool>())
            .prop_map(move |(t, sci)| format!("garbage_collection_threshold:{}", text(t, sci))),
        (prop_oneof![fraction, Just(0.0), Just(1.0)], any::<bool>())
            .prop_map(move |(t, sci)| format!("per_process_memory_fraction:{}", text(t, sci))),
        bool_word
            .clone()
            .prop_map(|b| format!("expandable_segments:{b}")),
        bool_word
            .clone()
            .prop_map(|b| format!("release_lock_on_cudamalloc:{b}")),
        bool_word
            .clone()
            .prop_map(|b| format!("pinned_use_hip_host_register:{b}")),
        bool_word
            .clone()
            .prop_map(|b| format!("pinned_use_background_threads:{b}")),
        bool_word.prop_map(|b| format!("graph_capture_record_stream_reuse:{b}")),
        power(7).prop_map(|n| format!("pinned_num_register_threads:{n}")),
        (1u64..=u64::MAX).prop_map(|n| format!("pinned_reserve_segment_size_mb:{n}")),
        any::<u64>().prop_map(|n| format!("pinned_max_round_threshold_mb:{n}")),
        any::<u64>().prop_map(|n| format!("pinned_max_cached_size_mb:{n}")),
        Just("backend:native".to_string()),
        Just("large_segment_size_mb:20".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// parse → display → parse is the identity on valid configurations (under either `>`
    /// rule for the written form), and display is stable.
    #[test]
    fn display_parses_back_to_the_same_configuration(
        options in proptest::collection::vec(option(), 0..8),
        spaced in any::<bool>(),
        fill in prop_oneof![
            Just(GreaterThanFill::AfterLastListed),
            Just(GreaterThanFill::FromLastListed)
        ],
    ) {
        let sep = if spaced { " , " } else { "," };
        let input = options.join(sep);
        let c = AllocatorConfig::parse_with(&input, fill)
            .map_err(|e| TestCaseError::fail(format!("`{input}`: {e}")))?;
        let written = c.to_string();
        let back = AllocatorConfig::parse(&written)
            .map_err(|e| TestCaseError::fail(format!("`{written}`: {e}")))?;
        prop_assert_eq!(&back, &c, "`{}` wrote `{}`", input, written);
        let old_rule = AllocatorConfig::parse_with(&written, GreaterThanFill::FromLastListed);
        prop_assert_eq!(old_rule.as_ref(), Ok(&c));
        prop_assert_eq!(back.to_string(), written);
    }

    /// Any table of 0-or-power-of-two divisions survives being written and read back.
    #[test]
    fn any_divisions_table_round_trips(
        table in proptest::array::uniform16(prop_oneof![Just(0u64), (0u32..64).prop_map(|e| 1u64 << e)]),
    ) {
        let d = RoundupPower2Divisions::from_intervals(table).unwrap();
        prop_assert_eq!(RoundupPower2Divisions::parse(&d.to_string()), Ok(d));
        let c = AllocatorConfig::default().with_roundup_power2_divisions(d);
        prop_assert_eq!(reparsed(&c), c);
    }
}
