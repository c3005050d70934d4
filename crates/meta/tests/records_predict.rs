//! `predict` in a process that counts its heap: every sample names the records the training
//! code keeps beside its tensors (burn's graph nodes for an LSTM's forward), per category, and
//! adds them to the host categories; the tensors stay Meta's ledger. (A file of its own: the
//! forward below is never backwarded, and its graph would stay in the process-wide autodiff
//! state that `tests/records.rs` compares.)

use burn::backend::Autodiff;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::tensor::{Tensor, TensorData};
use trainmem_burn::agreement::TRACKER_COMPARED;
use trainmem_core::timeline::Phase;
use trainmem_core::{Category, CategoryBytes};
use trainmem_meta::Meta;
use trainmem_probe::CountingAlloc;
use trainmem_track::materialize;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

#[derive(Module, Debug)]
struct Sequence<B: burn::tensor::backend::Backend> {
    lstm: Lstm<B>,
    head: Linear<B>,
}

/// `predict` on a process that counts its heap: every sample names the records beside the
/// tensors, per category, and adds them to the host categories; the tensors stay the ledger's.
#[test]
fn predictions_carry_the_records_beside_the_tensors() {
    type A = Autodiff<Meta>;
    let mut tensors = CategoryBytes::ZERO;
    let run = trainmem_meta::predict("lstm records", |rec| {
        let device = rec.device();
        let model = rec.phase(Phase::ModelInit, Category::Parameter, || {
            let model = Sequence::<A> {
                lstm: LstmConfig::new(16, 32, true).init(&device),
                head: LinearConfig::new(32, 16).init(&device),
            };
            materialize(&model);
            model
        });
        let x = rec.phase(Phase::BatchLoaded, Category::Input, || {
            let values: Vec<f32> = (0..8 * 24 * 16).map(|v| (v % 7) as f32).collect();
            Tensor::<A, 3>::from_data(TensorData::new(values, [8, 24, 16]), &device)
        });
        let _loss = rec.phase(Phase::Forward, Category::Activation, || {
            let (seq, _) = model.lstm.forward(x.clone(), None);
            MseLoss::new().forward(model.head.forward(seq), x, Reduction::Mean)
        });
        tensors = device.stats().live;
    });
    let forward = &run.timeline.samples.last().expect("samples").host;
    let before = &run.timeline.samples[run.timeline.samples.len() - 2].host;
    let records =
        forward.records.get(Category::Activation) - before.records.get(Category::Activation);
    assert!(
        records > 200_000,
        "the LSTM's forward keeps its graph's records: {records} B"
    );
    for c in TRACKER_COMPARED {
        assert_eq!(
            forward.categories.get(c),
            tensors.get(c) + forward.records.get(c),
            "{c:?}: the ledger's tensors plus the records"
        );
    }
}
