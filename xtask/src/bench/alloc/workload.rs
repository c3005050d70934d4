//! A deterministic, transformer-like training allocation trace.
//!
//! The trace follows what an eager framework asks of its device allocator during training:
//! parameters once; per step the input batch, the activations of each block in forward (kept
//! until backward), temporaries freed at once, gradients made in backward while the saved
//! activations are released in reverse order, Adam's two moments at the first step, the
//! optimizer's temporaries, and `zero_grad(set_to_none)` at the end of the step. Sequence length
//! varies from step to step so the same call sites ask for different sizes (the pattern that
//! makes caching allocators split and fragment), and blocks have different widths so both the
//! small (≤ 1 MiB) and the large pool see traffic. A short evaluation pass runs now and then.

/// One allocator operation on a dense slot table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes and keep the block in `slot`.
    Alloc {
        /// Slot index (recycled after the block is freed).
        slot: u32,
        /// Requested bytes.
        size: u64,
    },
    /// Free the block in `slot`.
    Free {
        /// Slot index.
        slot: u32,
    },
}

/// Shape of the generated workload.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Training steps.
    pub steps: u32,
    /// Sequences per batch.
    pub batch: u64,
    /// Sequence lengths drawn (deterministically) per step.
    pub seq_lens: Vec<u64>,
    /// Width of each transformer block (heads = width / 64).
    pub widths: Vec<u64>,
    /// Vocabulary size (embedding and output head).
    pub vocab: u64,
    /// An evaluation pass every this many steps (0: never).
    pub eval_every: u32,
    /// Seed of the sequence-length draw.
    pub seed: u64,
}

impl WorkloadConfig {
    /// The benchmark's default model: eight blocks of widths 512 to 1536, batch 8, sequence
    /// length 192 to 512, a 16k vocabulary, fp32.
    pub fn transformer(steps: u32) -> Self {
        Self {
            steps,
            batch: 8,
            seq_lens: vec![192, 256, 320, 384, 448, 512],
            widths: vec![512, 768, 1024, 1536, 1024, 768, 1024, 512],
            vocab: 16_384,
            eval_every: 100,
            seed: 0x007a_110c,
        }
    }
}

/// The generated trace and what is known about it independently of any allocator.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The operations, in order.
    pub ops: Vec<Op>,
    /// Number of slots the ops use (slot indices are `< slots`).
    pub slots: usize,
    /// Allocations in the trace.
    pub allocs: u64,
    /// Peak of the sum of live requested bytes: a lower bound for any allocator's footprint.
    pub peak_requested: u64,
    /// Requests of at most 1 MiB (PyTorch's small pool).
    pub small_allocs: u64,
}

/// SplitMix64: tiny, deterministic, good enough to pick sequence lengths.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Records ops and recycles slots.
#[derive(Default)]
struct Recorder {
    ops: Vec<Op>,
    free_slots: Vec<u32>,
    slots: u32,
    sizes: Vec<u64>,
    live: u64,
    peak: u64,
    allocs: u64,
    small: u64,
}

/// A live block in the recorder.
#[derive(Debug, Clone, Copy)]
struct Block(u32);

impl Recorder {
    fn alloc(&mut self, size: u64) -> Block {
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.slots += 1;
            self.sizes.push(0);
            self.slots - 1
        });
        self.sizes[slot as usize] = size;
        self.live += size;
        self.peak = self.peak.max(self.live);
        self.allocs += 1;
        if size <= 1 << 20 {
            self.small += 1;
        }
        self.ops.push(Op::Alloc { slot, size });
        Block(slot)
    }

    fn free(&mut self, block: Block) {
        self.live -= self.sizes[block.0 as usize];
        self.free_slots.push(block.0);
        self.ops.push(Op::Free { slot: block.0 });
    }

    /// A temporary: allocated and freed at once after the next allocation.
    fn temp(&mut self, size: u64) {
        let b = self.alloc(size);
        self.free(b);
    }
}

const F32: u64 = 4;
const I64: u64 = 8;

/// Parameter shapes (in elements) of one block of width `d`.
fn block_params(d: u64) -> Vec<u64> {
    vec![
        d,         // ln1 weight
        d,         // ln1 bias
        3 * d * d, // qkv weight
        3 * d,     // qkv bias
        d * d,     // out-proj weight
        d,         // out-proj bias
        d,         // ln2 weight
        d,         // ln2 bias
        4 * d * d, // fc1 weight
        4 * d,     // fc1 bias
        4 * d * d, // fc2 weight
        d,         // fc2 bias
    ]
}

/// Generates the workload.
pub fn generate(config: &WorkloadConfig) -> Workload {
    let mut rec = Recorder::default();
    let mut rng = SplitMix(config.seed);
    let d0 = config.widths.first().copied().unwrap_or(512);
    let d_last = config.widths.last().copied().unwrap_or(512);

    // Parameters, allocated once: embedding, per block (plus a projection where the width
    // changes), final norm, output head.
    let mut param_sizes: Vec<u64> = vec![config.vocab * d0 * F32];
    let mut prev = d0;
    for &d in &config.widths {
        if d != prev {
            param_sizes.push(prev * d * F32);
        }
        param_sizes.extend(block_params(d).into_iter().map(|e| e * F32));
        prev = d;
    }
    param_sizes.extend([d_last * F32, d_last * F32, d_last * config.vocab * F32]);
    let _params: Vec<Block> = param_sizes.iter().map(|&s| rec.alloc(s)).collect();
    let mut adam_state: Vec<Block> = Vec::new();
    let mut logged_losses: Vec<Block> = Vec::new();

    for step in 0..config.steps {
        let seq = config.seq_lens[(rng.next() % config.seq_lens.len() as u64) as usize];
        let tokens = config.batch * seq;

        // Input batch: token ids and labels (int64), copied to the device.
        let ids = rec.alloc(tokens * I64);
        let labels = rec.alloc(tokens * I64);

        // Forward: every saved tensor is pushed; backward pops them in reverse.
        let mut saved: Vec<Block> = Vec::new();
        saved.push(rec.alloc(tokens * d0 * F32)); // embedding output
        let mut prev = d0;
        for &d in &config.widths {
            if d != prev {
                saved.push(rec.alloc(tokens * d * F32)); // width projection
            }
            forward_block(&mut rec, &mut saved, config.batch, seq, d);
            prev = d;
        }
        saved.push(rec.alloc(tokens * F32)); // final norm stats
        saved.push(rec.alloc(tokens * d_last * F32)); // final norm output
        let logits = rec.alloc(tokens * config.vocab * F32);
        rec.temp(tokens * config.vocab * F32); // log-softmax
        let loss = rec.alloc(F32);
        rec.free(ids);

        // Backward: grad of the logits, then per saved tensor (in reverse) a gradient of the
        // same size, freeing the saved tensor as soon as it is consumed; parameter gradients
        // appear block by block.
        let mut grad = rec.alloc(tokens * config.vocab * F32);
        rec.free(logits);
        rec.free(labels);
        let mut param_grads: Vec<Block> = Vec::new();
        let mut grad_sizes = param_sizes.iter().rev();
        let per_saved = param_sizes.len().div_ceil(saved.len().max(1));
        while let Some(activation) = saved.pop() {
            let size = rec.sizes[activation.0 as usize];
            rec.temp(size); // local gradient scratch
            for _ in 0..per_saved {
                if let Some(&g) = grad_sizes.next() {
                    param_grads.push(rec.alloc(g));
                }
            }
            let next = rec.alloc(size);
            rec.free(activation);
            rec.free(grad);
            grad = next;
        }
        for &g in grad_sizes {
            param_grads.push(rec.alloc(g));
        }
        rec.free(grad);

        // Optimizer (Adam): moments at the first step, then per parameter two temporaries.
        if step == 0 {
            for &s in &param_sizes {
                adam_state.push(rec.alloc(s));
                adam_state.push(rec.alloc(s));
            }
        }
        for &s in &param_sizes {
            let t1 = rec.alloc(s);
            let t2 = rec.alloc(s);
            rec.free(t1);
            rec.free(t2);
        }
        // zero_grad(set_to_none=True)
        for g in param_grads.drain(..) {
            rec.free(g);
        }

        // The loss is kept for logging and released every 50 steps.
        logged_losses.push(loss);
        if logged_losses.len() == 50 {
            for l in logged_losses.drain(..) {
                rec.free(l);
            }
        }

        if config.eval_every > 0 && (step + 1) % config.eval_every == 0 {
            eval_pass(&mut rec, config, d0);
        }
    }
    Workload {
        slots: rec.slots as usize,
        allocs: rec.allocs,
        peak_requested: rec.peak,
        small_allocs: rec.small,
        ops: rec.ops,
    }
}

/// One block's forward: tensors saved for backward go to `saved`, the rest are temporaries.
fn forward_block(rec: &mut Recorder, saved: &mut Vec<Block>, batch: u64, seq: u64, d: u64) {
    let tokens = batch * seq;
    let heads = (d / 64).max(1);
    saved.push(rec.alloc(tokens * F32)); // ln1 mean/rstd
    saved.push(rec.alloc(tokens * d * F32)); // ln1 out
    saved.push(rec.alloc(tokens * 3 * d * F32)); // qkv
    rec.temp(batch * heads * seq * seq * F32); // raw scores
    saved.push(rec.alloc(batch * heads * seq * seq * F32)); // softmax
    saved.push(rec.alloc(tokens * d * F32)); // attention output
    rec.temp(tokens * d * F32); // out-proj before the residual add
    saved.push(rec.alloc(tokens * d * F32)); // residual 1
    saved.push(rec.alloc(tokens * F32)); // ln2 mean/rstd
    saved.push(rec.alloc(tokens * d * F32)); // ln2 out
    saved.push(rec.alloc(tokens * 4 * d * F32)); // fc1 out
    saved.push(rec.alloc(tokens * 4 * d * F32)); // gelu out
    rec.temp(tokens * d * F32); // fc2 out before the residual add
    saved.push(rec.alloc(tokens * d * F32)); // residual 2
}

/// A forward-only pass at a different batch size: activations are freed as soon as the next
/// layer has consumed them.
fn eval_pass(rec: &mut Recorder, config: &WorkloadConfig, d0: u64) {
    let batch = config.batch * 2;
    let seq = config.seq_lens[config.seq_lens.len() / 2];
    let tokens = batch * seq;
    let mut x = rec.alloc(tokens * d0 * F32);
    for &d in &config.widths {
        let heads = (d / 64).max(1);
        let h = rec.alloc(tokens * 3 * d * F32);
        rec.temp(batch * heads * seq * seq * F32);
        rec.free(h);
        let up = rec.alloc(tokens * 4 * d * F32);
        let y = rec.alloc(tokens * d * F32);
        rec.free(up);
        rec.free(x);
        x = y;
    }
    let logits = rec.alloc(tokens * config.vocab * F32);
    rec.free(x);
    rec.free(logits);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_deterministic_and_balanced() {
        let config = WorkloadConfig::transformer(5);
        let a = generate(&config);
        let b = generate(&config);
        assert_eq!(a.ops, b.ops);

        // Every free matches a live alloc; what stays live at the end is parameters, Adam
        // state and the logged losses.
        let mut live = vec![None; a.slots];
        for op in &a.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    assert!(live[slot as usize].is_none(), "slot reused while live");
                    live[slot as usize] = Some(size);
                }
                Op::Free { slot } => {
                    assert!(live[slot as usize].take().is_some(), "free of a dead slot");
                }
            }
        }
        let projections = config.widths.windows(2).filter(|w| w[0] != w[1]).count();
        // embedding + final norm (2) + head, the blocks, the width projections
        let params = 4 + config.widths.len() * 12 + projections;
        let still = live.iter().flatten().count();
        assert_eq!(
            still,
            params * 3 + 5,
            "params + 2 Adam moments each + 5 logged losses"
        );
    }

    #[test]
    fn exercises_both_pools_and_many_sizes() {
        let w = generate(&WorkloadConfig::transformer(20));
        assert!(w.small_allocs > 1000, "{}", w.small_allocs);
        assert!(w.allocs - w.small_allocs > 1000);
        let mut sizes: Vec<u64> = w
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Alloc { size, .. } => Some(*size),
                Op::Free { .. } => None,
            })
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        assert!(sizes.len() > 50, "only {} distinct sizes", sizes.len());
    }
}
