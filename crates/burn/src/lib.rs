//! Real burn training runs with memory probes, beside their simulated twin.
//!
//! trainmem-burn trains the network a trainmem plan describes on burn 0.21.0 (the Flex CPU
//! backend by default; CUDA with the `cuda` feature), samples memory at every phase boundary
//! after a device sync, and returns the same [`Timeline`](trainmem_core::timeline::Timeline)
//! type the simulator produces, so the two can be laid side by side.
//!
//! * [`run_measured`] / [`run_measured_detailed`]: train a [`Plan`](trainmem_core::plan::Plan)
//!   for real and measure it (see [`run`] for the knobs honoured and the category tags).
//! * [`Net`]: burn-nn networks built from the plan's model spec (MLP, CNN, transformer).
//! * [`Probe`]: samples host bytes per category (trainmem-probe's counting allocator, when the
//!   binary installs it), the `/proc` RSS breakdown, and device pools on CUDA.
//! * [`BatchSource`]: where batches come from.
//!
//! Host bytes per category need the counting allocator as the binary's global allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();
//! ```
//!
//! Without it a run still works; its host categories are reported as unavailable.
//!
//! # burn_facts
//!
//! What burn 0.21.0 does with memory, measured on `Autodiff<Flex>` with trainmem-probe's
//! counting allocator through [`run_measured_detailed`] (categories are allocation-time
//! tags; see [`run`]).
//!
//! Setting: an MLP 256 → 512 → 256 with ReLU (262,912 f32 parameters = 1,051,648 bytes),
//! batch 32, MSE, one training thread, batches from trainmem-loader over a memory-mapped
//! fixture; figures are live heap bytes at phase boundaries. Reproduce them with
//! `cargo run -p trainmem-burn --example burn_facts`.
//! The `burn_measured` tests re-check the optimizer, leak and loader facts on every CI run,
//! with margins derived from the model's own sizes.
//!
//! * **Optimizer state is lazy and appears at the first `step`.** Live bytes after step 1
//!   minus after model construction: SGD +2,864 (bookkeeping only), momentum +1,054,592 (1×
//!   parameters), Adam +2,109,424 (2× parameters + 6 KB of per-parameter records); exactly
//!   flat afterwards (Adam: 4,233,454 bytes at the end of steps 2, 3 and 4). burn-optim's
//!   Adam allocates both moments at the first step; AdamW the same.
//! * **Momentum's first velocity is the gradient buffer.** At step 1 the velocity is
//!   `grad.clone()` (a reference, no copy), so with allocation-time tags its bytes stay under
//!   `gradient` after the step; from step 2 the velocity is a new tensor made inside the step
//!   and sits under `optimizer_state` (1,057,368 bytes). Totals are the same either way.
//! * **Parameters are updated in place on Flex** (a uniquely owned buffer is reused), so the
//!   `parameter` category stays constant across steps (1,053,552 to 1,054,672 bytes
//!   including burn-nn's module bookkeeping) — unless something else holds the old values
//!   (next point).
//! * **Kept graphs leak linearly, and pin weights.** Keeping each step's output of a forward
//!   whose graph is never backwarded (burn has no `retain_graph`; this is its analogue) grows
//!   live bytes by exactly 725,948 per step: the saved activations (168,812), the batch the
//!   first layer saved (32,832), and the second layer's weight matrix (524,288 + bookkeeping)
//!   that the kept graph still references, which stops the optimizer from updating it in
//!   place — the new weights are allocated inside the step (under `optimizer_state`) while
//!   the old ones stay with the graph. Keeping outputs whose graph *was* backwarded holds only
//!   their values: +32,992 per step (one batch of logits, 32,768). Without retention live
//!   bytes are exactly flat from step to step.
//! * **Dropping kept graphs frees them late.** burn-autodiff keeps graphs in a process-wide
//!   registry; after every backward pass it frees the orphaned graph roots nobody references,
//!   one layer per pass. Clearing the kept outputs every 2 steps bounds the total (the
//!   growth per step alternates +461,132 / −461,132 bytes) instead of freeing at once. A run flushes orphans with trivial
//!   backward passes before it starts and after it ends, so runs do not see each other's
//!   graphs.
//! * **Activations: forward vs after backward.** The forward pass adds 201,988 activation
//!   bytes; backward frees the saved ones and allocates 1,052,960 gradient bytes (the peak
//!   inside backward is 626 KB above the level after it: temporaries); 33 KB of activations
//!   remain after backward (the logits and loss, held until metrics are recorded).
//! * **Balanced checkpointing** (`Autodiff<_, BalancedCheckpointing>`): an MLP
//!   256 → 512 → 512 → 512 → 256 with GELU keeps 272,804 activation bytes after forward
//!   instead of 468,716 (−42%): element-wise ops are recomputed, matmul inputs still saved.
//! * **Checkpoint saving spikes by the model size.** Converting the module into a record item
//!   (before `BinFileRecorder` streams it to the file) holds a host copy of every parameter:
//!   +1,053,201 bytes (`temporary`) at `checkpoint_save`, gone right after.
//! * **Half precision on Flex.** Flex stores and computes F16 and BF16; casting the
//!   parameters halves them (525,824 bytes), Adam's moments follow the parameters' dtype
//!   (1,060,552 bytes), activations halve (103,954 bytes after forward).
//! * **Metric retention.** Keeping the loss tensor per step costs ≈ 250 bytes per step (its
//!   graph was consumed by backward); keeping the detached outputs costs one batch of logits
//!   per step (+32,900).
//! * **Kernel scratch that never goes away.** Flex's matrix products use the `gemm` crate,
//!   which keeps a thread-local packing buffer the size of the CPU's L2 cache (1 MiB here),
//!   allocated at the thread's first product and kept for the thread's life. A run trains on
//!   a thread of its own, makes the buffer before its baseline (under `other`; otherwise it
//!   would look like 1 MiB of activations that backward never frees), and it is freed when
//!   that thread exits, before the run returns.
//! * **`memory_cleanup` (empty_cache)** is a no-op on Flex (its tensors are plain heap memory
//!   with no pool); on CUDA it releases cubecl's free pages (`ComputeClient::memory_cleanup`,
//!   current stream only in cubecl 0.10).
//! * **Loader epochs.** trainmem-loader's workers are spawned per epoch (3 epochs × 2 workers
//!   = 6 threads) or once with `persistent_workers` (2); at an epoch's first batch up to
//!   `prefetch_factor × workers` batches are in flight and the input bytes fall as the epoch's
//!   last batches are taken (176 KB at the first batch, 76 KB at the fourth, with 4 batches
//!   per epoch). Respawned workers return to the baseline at every epoch end; persistent
//!   workers already hold the next epoch's first batches there (up to `prefetch_factor ×
//!   workers`, the same bound), because trainmem-loader keeps them busy across the boundary.
//! * **Parameters are lazy in burn 0.21, and stay lazy on Flex until first read.** The
//!   startup plan (MLP 784 → 1024 → 1024 → 10, 7,454,760 parameter bytes, AdamW) with
//!   `RunOptions::lazy_parameters`: at `model_init` the `parameter` category holds 3,432
//!   bytes (eager: 7,463,640) and 6 parameters are still uninitialised; the first forward
//!   creates them, so its `activation` bytes are 9,575,952 instead of 2,119,148 (+7,456,804,
//!   the parameters, tagged by the phase that allocated them). Later steps are identical.
//! * **Augmentation scratch and the epoch start** (the epoch-spike plan at the time of
//!   measuring: MLP on 3,072 features, batch 64, 6 batches per epoch, 2 workers × prefetch 2,
//!   `augmentation_scratch = 2`, `size_variation = 0.25`): the input peak between samples is
//!   4.1–7.4 MB over the first three batches of every epoch and 1.59 MB at the last batch; the
//!   loader's scratch peaks at 3.5 MB (two busy workers, ≈ 2 × 1.1 × 786 KB each). With
//!   persistent workers the loader keeps building the next epoch's batches while the current
//!   epoch's last ones are consumed, so an epoch ends holding 4 built batches (3,161,590
//!   `input` bytes at `epoch_end` instead of 1,330) and the next epoch starts from there: the
//!   swing from the epoch end to the first step's peak falls from about 5.2 MB to about
//!   1.9 MB, while the peak itself stays at 5.1–5.5 MB (respawned: 5.2–5.8 MB), since the
//!   queue holds the same `prefetch_factor × workers` batches in both cases (measured with
//!   `cargo xtask scenario epoch-spike`). Persistence also saves the respawn (2 threads
//!   instead of 6).
//! * **Preload vs mmap** (4,096 samples × 12,296 bytes): `preload` holds 50,364,416 bytes
//!   under `input` from the `start` sample (RssAnon 62.0 MB at start vs 0.4 MB for `mmap`);
//!   `mmap` instead grows RssFile from 5.5 MB to 57.4 MB as the epoch reads the file.
//! * **Pinned staging** (batch 64 × 3,000 features, 2 workers × prefetch 2): 5 page-rounded
//!   staging blocks of 774,144 bytes, 3,870,720 bytes, all page-locked (no `mlock` failure
//!   with RLIMIT_MEMLOCK 8 MiB, as root), kept for the loader's life (`input` bytes stay
//!   3.87 MB at the end instead of returning to 1.2 KB).
//! * **Allocation trace** (the empty-cache plan: MLP 1024 → 4096 → 1024, batch 256, Adam, 6
//!   steps): 613 host allocations and frees of at least 4 KiB (313 allocations, largest
//!   16,777,216 bytes: a 1024 × 4096 weight), none dropped.

#![warn(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
mod error;
pub mod model;
pub mod probe;
pub mod run;
pub mod timeline;

pub use data::{BatchSource, HostBatch, SyntheticSource};
pub use error::BurnRunError;
pub use model::{Batch, BatchInput, BatchTarget, ExampleShape, Net, example_shape};
pub use probe::{DeviceMemory, MemoryBackend, Probe, ProbeSample, host_counting_available};
pub use run::{
    BackendChoice, MeasuredRun, Progress, RunOptions, run_measured, run_measured_detailed,
};
