//! The op families whose every method has a default in burn: activations (composed of float
//! ops) and transactions (reading several tensors back at once).

use burn::tensor::ops::{ActivationOps, TransactionOps};

use crate::backend::Meta;

impl ActivationOps<Self> for Meta {}

impl TransactionOps<Self> for Meta {}
