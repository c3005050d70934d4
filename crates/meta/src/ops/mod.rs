//! burn's op traits implemented for [`crate::Meta`], one module per family.

mod bool;
pub(crate) mod common;
mod float;
mod int;
mod module;
mod other;
mod qtensor;
