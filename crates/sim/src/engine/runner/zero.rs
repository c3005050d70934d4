//! ZeRO layer hooks: sharded parameters gathered around each layer, fresh gradients
//! reduce-scattered into shards.

use trainmem_autograd::{LayerHooks, ParamId, Pass, Program, TensorId, TensorStore};

use trainmem_core::Category;
use trainmem_core::Dtype;
use trainmem_optim::Sharding;

use crate::engine::memory::{SimMemory, SimOom};

/// ZeRO layer hooks: gather sharded parameters around each layer (stage 3) and
/// reduce-scatter fresh gradients into shards after each layer's backward (stage ≥ 2).
pub(super) struct ZeroHooks {
    sharding: Sharding,
    layer_params: Vec<Vec<ParamId>>,
    param_full_bytes: Vec<u64>,
    param_shard_bytes: Vec<u64>,
    grad_shard_bytes: Vec<u64>,
    gathered: Vec<TensorId>,
    /// Per parameter: its gradient is already a shard.
    pub(super) grad_is_shard: Vec<bool>,
}

impl ZeroHooks {
    /// The hooks of `program` under `sharding`, parameters in `compute`, gradients in
    /// `grad_dtype`.
    pub(super) fn new(
        program: &Program,
        sharding: Sharding,
        compute: Dtype,
        grad_dtype: Dtype,
    ) -> ZeroHooks {
        let mut layer_params = vec![Vec::new(); program.layers.len()];
        for (i, p) in program.params.iter().enumerate() {
            if let Some(l) = layer_params.get_mut(p.layer as usize) {
                l.push(i as ParamId);
            }
        }
        let per_param = |f: &dyn Fn(u64) -> u64| -> Vec<u64> {
            program.params.iter().map(|p| f(p.elems)).collect()
        };
        ZeroHooks {
            sharding,
            layer_params,
            param_full_bytes: per_param(&|e| e * compute.size()),
            param_shard_bytes: per_param(&|e| sharding.param_elems(e) * compute.size()),
            grad_shard_bytes: per_param(&|e| sharding.grad_elems(e) * grad_dtype.size()),
            gathered: Vec::new(),
            grad_is_shard: vec![false; program.params.len()],
        }
    }

    /// The gradients were dropped: the next ones start full again.
    pub(super) fn grads_dropped(&mut self) {
        for s in self.grad_is_shard.iter_mut() {
            *s = false;
        }
    }
}

impl LayerHooks<SimMemory> for ZeroHooks {
    fn before_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        layer: u32,
        _pass: Pass,
    ) -> Result<(), SimOom> {
        if self.sharding.shards_params() {
            for &p in &self.layer_params[layer as usize] {
                let extra = self.param_full_bytes[p as usize] - self.param_shard_bytes[p as usize];
                let t = store.alloc(extra, Category::Parameter)?;
                self.gathered.push(t);
            }
        }
        Ok(())
    }

    fn after_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        layer: u32,
        pass: Pass,
        grads: &mut [Option<TensorId>],
    ) -> Result<(), SimOom> {
        for t in self.gathered.drain(..) {
            store.release(t);
        }
        if pass == Pass::Backward && self.sharding.shards_grads() {
            for &p in &self.layer_params[layer as usize] {
                let p = p as usize;
                if let Some(full) = grads[p]
                    && !self.grad_is_shard[p]
                {
                    let shard = store.alloc(self.grad_shard_bytes[p], Category::Gradient)?;
                    store.release(full);
                    grads[p] = Some(shard);
                    self.grad_is_shard[p] = true;
                }
            }
        }
        Ok(())
    }
}
