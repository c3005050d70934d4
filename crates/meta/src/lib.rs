//! trainmem-meta: a burn backend whose tensors have shapes and dtypes but no data.
//!
//! [`Meta`] implements every op trait of burn 0.21's `Backend` (float, int, bool, module,
//! activation, quantized, transaction). Each op computes its output's shape and dtype and
//! allocates a counted buffer for it, so a user's real training code — model, loss, autodiff
//! (`Autodiff<Meta>`, with either checkpointing strategy), burn's optimizers — runs unchanged on
//! any machine and at any scale, with every tensor's life going through a memory model.
//!
//! # Predicting a custom model's memory
//!
//! ```
//! use burn::backend::Autodiff;
//! use burn::module::Module;
//! use burn::nn::{Linear, LinearConfig, Relu};
//! use burn::nn::loss::{MseLoss, Reduction};
//! use burn::optim::{AdamConfig, GradientsParams, Optimizer};
//! use burn::tensor::{Distribution, Tensor, backend::Backend};
//! use trainmem_core::Category;
//! use trainmem_core::timeline::Phase;
//! use trainmem_track::materialize;
//! use trainmem_meta::{Meta, predict};
//!
//! #[derive(Module, Debug)]
//! struct Net<B: Backend> {
//!     up: Linear<B>,
//!     act: Relu,
//!     down: Linear<B>,
//! }
//!
//! impl<B: Backend> Net<B> {
//!     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
//!         self.down.forward(self.act.forward(self.up.forward(x)))
//!     }
//! }
//!
//! type B = Autodiff<Meta>;
//! // A 4096 → 16384 → 4096 block: 134 M parameters, 537 MB in f32 — no bytes are allocated.
//! let run = predict("custom block", |rec| {
//!     let device = rec.device();
//!     let net = rec.phase(Phase::ModelInit, Category::Parameter, || {
//!         let net = Net::<B> {
//!             up: LinearConfig::new(4096, 16384).init(&device),
//!             act: Relu::new(),
//!             down: LinearConfig::new(16384, 4096).init(&device),
//!         };
//!         materialize(&net); // burn creates parameters lazily; create them now
//!         net
//!     });
//!     let mut optim = AdamConfig::new().init();
//!     let x = rec.phase(Phase::BatchLoaded, Category::Input, || {
//!         Tensor::<B, 2>::random([512, 4096], Distribution::Default, &device)
//!     });
//!     let loss = rec.phase(Phase::Forward, Category::Activation, || {
//!         MseLoss::new().forward(net.forward(x.clone()), x, Reduction::Mean)
//!     });
//!     let grads = rec.phase(Phase::Backward, Category::Gradient, || {
//!         GradientsParams::from_grads(loss.backward(), &net)
//!     });
//!     let _net = rec.phase(Phase::OptimizerStep, Category::OptimizerState, || {
//!         optim.step(1e-4, net, grads)
//!     });
//! });
//! let params: u64 = (4096 * 16384 + 16384 + 16384 * 4096 + 4096) * 4;
//! let after_step = run.timeline.samples.last().unwrap().host.categories;
//! // Adam updates the parameters in place and keeps two moments per parameter.
//! assert_eq!(after_step.get(Category::Parameter), params);
//! assert_eq!(after_step.get(Category::OptimizerState), 2 * params);
//! assert_eq!(after_step.get(Category::Gradient), 0);
//! ```
//!
//! # What is modelled
//!
//! * **Shapes and dtypes** of every op, checked against the Flex backend's actual outputs
//!   (`tests/shapes.rs`), including broadcasting, reductions, matmul, conv/pool/interpolate,
//!   embedding, attention, FFTs, cat/slice/reshape/permute/expand.
//! * **Bytes**: every buffer is `elements × dtype size` (bool 1 byte, quantized 1 byte per
//!   value), counted from the op that creates it until the last tensor sharing it is dropped,
//!   under the category the creating thread carries (trainmem-probe's tag, as measured runs set
//!   it). Live bytes and peaks per category are kept by the device's [`Ledger`]
//!   ([`MetaDevice::stats`]).
//! * **The CPU backend's buffer reuse** ([`tensor`] has the rules): views share their input's
//!   buffer; element-wise ops write in place when their (left) input is uniquely owned and
//!   contiguous; concatenation allocates once. On a two-layer MLP trained with Adam and AdamW
//!   the bytes per category agree with the bytes Flex really allocates, counted by
//!   trainmem-probe's allocator, within 1% + 16 KiB at every phase (`tests/flex_bytes.rs`).
//! * **trainmem-alloc's caching allocator** ([`CachingModel`]): every buffer is a `malloc` /
//!   `free` of PyTorch's caching allocator over a modelled device, so a run predicts allocated
//!   and reserved bytes, the cache, `empty_cache` (`Backend::memory_cleanup`), out-of-memory
//!   reports, and gives a PyTorch-format snapshot for memory_viz.
//! * **cubecl's memory management** ([`CubeclModel`], [`MetaDevice::cubecl`]): every buffer is
//!   a `reserve` in cubecl-runtime 0.10's own pools (the code burn 0.21's CUDA backend
//!   allocates from, configured as cubecl-cuda configures it) over a storage that counts pages
//!   instead of allocating them, so a run predicts what burn on CUDA reserves: pages held,
//!   bytes in use, their peaks, and what `memory_cleanup` gives back ([`cubecl`] has the rules
//!   and what is not modelled).
//!
//!   ```
//!   use burn::tensor::{Tensor, backend::Backend};
//!   use trainmem_meta::{Meta, MetaDevice};
//!   // An 80 GiB device: cubecl's pools of 16 MiB, 64 MiB, ... pages.
//!   let (device, pools) = MetaDevice::cubecl(80 << 30);
//!   let x = Tensor::<Meta, 2>::zeros([1024, 1024], &device); // 4 MiB
//!   drop(x);
//!   let f = pools.figures();
//!   assert_eq!((f.in_use, f.peak_in_use), (0, 4 << 20));
//!   assert!(f.reserved >= 4 << 20, "the page stays reserved");
//!   Meta::memory_cleanup(&device);
//!   assert_eq!(pools.figures().reserved, 0);
//!   ```
//! * **trainmem-burn's training loop** (`trainmem_burn::run_predicted::<Meta>`, see
//!   [`tracked`]): the loop measured runs use trains a plan on Meta, only the backend type
//!   differing. For every scenario plan that runs on the
//!   CPU, the bytes per category at every phase boundary agree with the Flex run's within
//!   1% + 16 KiB (`tests/burn_loop.rs`; the largest difference seen is 12 KiB of 7.9 MB), and
//!   `trainmem scenario NAME --meta` makes the same comparison inside every scenario.
//! * **The records beside the tensors** (host memory on every backend): burn's autodiff graph
//!   nodes (one per float op, kept until a backward frees them; a batcher that builds items
//!   with a few ops makes a graph per op), its optimizers' per-parameter records and its
//!   modules' `Param` records. burn runs that code unchanged on Meta, Meta makes its own
//!   structures inside its ops ([`trainmem_probe::BackendScope`]) and its tensors have a
//!   measured run's size ([`tensor::MEASURED_PRIMITIVE_SIZE`]: burn keeps tensors inline in its
//!   records), so where the process counts its heap the host bytes left outside Meta's ops are
//!   those records, per category: [`predict`]'s samples carry them (`host.records`, added to
//!   `host.categories`), and so do the samples of `trainmem_burn::run_predicted::<Meta>`. On an
//!   LSTM (records: 56% of what a forward adds to the activations) and a batcher that builds each
//!   item with a few ops (71% of the batch), Meta's records and its totals
//!   ([`MemoryStats::flex_host_bytes`] plus the records) predict Flex's within 1% + 16 KiB at
//!   every phase (`tests/records.rs`).
//! * **Scale**: tensors of any size cost no host memory; a LLaMA-7B-shaped decoder
//!   (`examples/llama.rs`, 6.74 B parameters, sequence 2048) takes one AdamW step in about
//!   0.1 s with a peak RSS of about 6.5 MiB.
//! * **Further memory models** plug in through [`AllocationHook`] ([`MetaDevice::with_hook`]),
//!   which sees every allocation and free in order.
//!
//! # Conventions for data-dependent results
//!
//! * Reading values back (`into_data`, `into_scalar`, transactions) yields **zeros** of the
//!   tensor's shape and dtype (`false` for bool); the zeros are real host memory of the
//!   tensor's size, so reading back a huge tensor costs that much RAM. Ops that burn builds from a read-back see
//!   those zeros: `argwhere`/`nonzero` return empty results (no element is true), `sort` and
//!   `argsort` return correctly shaped tensors whose values mean nothing.
//! * Random tensors draw no values; [`Backend::seed`](burn::tensor::backend::Backend::seed) has
//!   no effect.
//! * Quantized tensors read back as zeros with a single scale of 1.0; reading back a
//!   block-quantized tensor panics (`q_into_data`).
//!
//! # Ops that panic
//!
//! Every op panics, naming itself (`trainmem-meta: float_matmul: ...`), when its inputs' shapes
//! do not fit together, as a real backend would fail. Beyond that, only `q_into_data` on a
//! block-quantized tensor panics.
//!
//! # Not modelled (limits)
//!
//! * Scratch inside a kernel: im2col buffers of convolutions, the scores a fused attention
//!   kernel holds, and gemm's per-thread packing workspace (about 1 MiB, made at the first
//!   matmul and kept for the life of the process; a measured run shows it once, under the tag of
//!   the phase that first multiplies).
//! * Host data that burn's default op implementations build and upload (`triu`/`tril` masks,
//!   `arange`, one-hot tables) is real, short-lived host memory; the uploaded tensor is counted.
//!   Meta's own `zeros`/`ones`/`full` build no host data.
//! * The scales of quantized tensors (≈1% of the tensor bytes on the MLP test).
//! * Flex's strides (8 bytes per dimension of every tensor object) in
//!   [`MemoryStats::flex_host_bytes`].
//! * Where Flex first copies a non-contiguous operand into a contiguous buffer before an
//!   element-wise op, Meta allocates only the output.
//! * The caching model treats all buffers as allocations on one stream; the cubecl model does
//!   not know burn's fusion (buffers a fused kernel never materialises are still counted) nor
//!   the row pitch of `Optimized` 2-D layouts.

mod backend;
pub mod caching;
pub mod cubecl;
mod device;
pub mod llama;
pub mod memory;
mod ops;
pub mod run;
mod shape;
pub mod tensor;
pub mod tracked;

pub use backend::Meta;
pub use caching::CachingModel;
pub use cubecl::{CubeclConfig, CubeclFigures, CubeclModel};
pub use device::MetaDevice;
pub use memory::{AllocationHook, DeviceTotals, Ledger, MemoryStats};
pub use run::{MetaRun, Recorder, predict, predict_on};
pub use tensor::{MetaQTensor, MetaTensor, tensor_bytes};
pub use tracked::PRODUCER;
