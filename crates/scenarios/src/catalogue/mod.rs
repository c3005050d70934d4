//! The fifteen scenarios, one module each: its plan's runs (`run(ctx)`), the rules that judge
//! them, and `EXPLANATION` (which bytes cause the pattern and what removes it). The registry
//! that names them is [`SCENARIOS`](crate::SCENARIOS).

pub(crate) mod activation_retention;
pub(crate) mod checkpoint_save;
pub(crate) mod empty_cache;
pub(crate) mod epoch_spike;
pub(crate) mod grad_accumulation;
pub(crate) mod grad_checkpointing;
pub(crate) mod logging_growth;
pub(crate) mod memmap_vs_preload;
pub(crate) mod mixed_precision;
pub(crate) mod model_parallel;
pub(crate) mod optimizer_jump;
pub(crate) mod per_batch_plateau;
pub(crate) mod pinned_staging;
pub(crate) mod retained_leak;
pub(crate) mod startup;
