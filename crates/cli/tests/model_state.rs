//! Plans whose model cannot be built (or whose size overflows) answer at once: `simulate`,
//! `fit` and `explain` on a model too large for the device, and on a mistyped size.

mod common;

use common::{empty_dir, s, stderr, stdout, trainmem, write};

/// A transformer plan of `layers` blocks of width `hidden` on an 80 GiB device.
fn deep(layers: u64, hidden: u64) -> String {
    format!(
        "name = \"deep\"\n[model.transformer]\nlayers = {layers}\nhidden = {hidden}\nheads = 8\n\
         seq_len = 128\nvocab = 1000\n[training]\nbatch_size = 1\nepochs = 1\n\
         steps_per_epoch = 2\n[device]\ncapacity = \"80GiB\"\n"
    )
}

#[test]
fn a_model_too_large_for_the_device_is_a_predicted_oom_at_model_init() {
    let dir = empty_dir("model-state-oom");
    let plan = write(&dir, "deep.toml", deep(100_000, 1024));
    // the figures, as the library works them out without lowering the model
    let lib = trainmem_sim::simulate(
        &trainmem_core::Plan::load(&plan).expect("loads"),
        trainmem_sim::SimOptions::default(),
    )
    .expect("a result");
    let oom = lib.summary.oom.expect("out of memory");
    let figures = trainmem_core::count::grouped(lib.summary.parameters);

    let out = trainmem(&["simulate", s(&plan)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("PREDICTED OUT OF MEMORY at step 0 (model_init)"),
        "{text}"
    );
    assert!(
        text.contains("model state alone exceeds the device"),
        "{text}"
    );
    assert!(text.contains(&figures), "{text}");
    assert!(text.contains(&oom.requested.to_string()), "{text}");

    let out = trainmem(&["simulate", s(&plan), "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(v["report"]["summary"]["oom"]["when"]["phase"], "model_init");

    let out = trainmem(&["explain", s(&plan)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // no step knob is simulated for a model that cannot be built (at once, not without a
    // limit)
    assert!(
        stdout(&out).contains("none of the plan's step knobs"),
        "{}",
        stdout(&out)
    );

    let out = trainmem(&["fit", s(&plan)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("even a batch size of 1 does not fit"),
        "{text}"
    );
    assert!(
        text.contains("model state alone exceeds the device"),
        "{text}"
    );
}

#[test]
fn a_mistyped_size_is_an_error_naming_the_figures() {
    let dir = empty_dir("model-state-overflow");
    let plan = write(&dir, "typo.toml", deep(1_000_000_000, 1_000_000));
    for cmd in ["simulate", "explain", "fit"] {
        let out = trainmem(&[cmd, s(&plan)]);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("overflows a 64-bit"), "{cmd}: {err}");
        assert!(err.contains("1000000000 × "), "{cmd}: {err}");
    }
}

#[test]
fn quiet_prints_nothing_on_stderr_and_conflicts_with_progress() {
    let dir = empty_dir("model-state-quiet");
    let plan = write(&dir, "small.toml", deep(2, 64));
    let out = trainmem(&["simulate", s(&plan), "--quiet"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    let out = trainmem(&["explain", s(&plan), "--quiet", "--progress"]);
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
}
