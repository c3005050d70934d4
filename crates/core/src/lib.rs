//! trainmem-core: the words every part of trainmem speaks.
//!
//! trainmem measures real training runs, simulates them, and lays the two side by side. Both
//! sides describe memory with the types here, and nothing here knows about burn, the
//! simulator or the allocator:
//!
//! * [`Category`] names what a byte is for (parameter, gradient, optimizer state, activation,
//!   input, temporary, cache, other), and [`CategoryBytes`] holds bytes per category.
//! * [`Dtype`] is the element type of a tensor; [`ByteSize`] is a byte count as people write
//!   it, with one unit rule everywhere ([`bytes`]: `KiB`, `MiB`, `GiB` are powers of 2; `KB`,
//!   `MB`, `GB` powers of 10).
//! * [`Plan`] is a training run described in TOML ([`plan`]), with its model ([`ModelSpec`],
//!   [`model`]) checked when it is read ([`model_check`]).
//! * [`Timeline`] is memory sampled at phase boundaries ([`timeline`]), from a measurement or a
//!   prediction alike.
//! * [`compare`] judges a prediction against a measurement, category by category.
//!
//! ```
//! use trainmem_core::{ByteSize, Category, Plan};
//! use trainmem_core::bytes::parse_bytes;
//!
//! assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
//! assert_eq!(parse_bytes("1GB"), Ok(1_000_000_000));
//!
//! let plan = Plan::from_toml_str(r#"
//!     [model.mlp]
//!     input = 784
//!     hidden = [256]
//!     output = 10
//!     [device]
//!     capacity = "8GiB"
//! "#)?;
//! assert_eq!(plan.device.capacity, ByteSize(8 << 30));
//! assert_eq!(Category::OptimizerState.name(), "optimizer_state");
//! # Ok::<(), trainmem_core::PlanError>(())
//! ```

#![forbid(unsafe_code)]

pub mod bytes;
pub mod category;
pub mod compare;
pub mod count;
pub mod dtype;
pub mod export;
pub mod framework;
pub mod hf_config;
pub mod model;
pub mod model_check;
pub mod op_kind;
pub mod optimizer;
pub mod plan;
pub mod timeline;

pub use bytes::ByteSize;
pub use category::Category;
pub use dtype::Dtype;
pub use framework::Framework;
pub use model::ModelSpec;
pub use op_kind::OpKind;
pub use optimizer::{OptimizerKind, StateAllocation, StepImpl};
pub use plan::{Plan, PlanError};
pub use timeline::{CategoryBytes, Domain, Phase, Sample, Source, Timeline};
