//! [`TrackedTensor`]: an inner backend's tensor with its share of the buffer count, and the
//! conversions the generated op implementations use.

use burn::tensor::backend::QTensorPrimitive;
use burn::tensor::ops::TransactionPrimitive;
use burn::tensor::quantization::{QuantPropagation, QuantScheme, QuantizationParametersPrimitive};
use burn::tensor::{DType, Shape, TensorMetadata, TensorPrimitive};
use burn_std::quantization::QuantAcc;

use crate::backend::Tracked;
use crate::buffer::TrackableBackend;
use std::sync::Arc;

use crate::ledger::{Handle, Keep, track};

/// A tensor of the inner backend, holding its buffer's token.
///
/// Cloning it clones the inner tensor (a shared buffer, as on the inner backend) and the token.
pub struct TrackedTensor<P> {
    /// The inner backend's tensor. Declared first, so it is dropped before the token.
    pub(crate) inner: P,
    /// `None` for a tensor of no bytes.
    pub(crate) token: Option<Keep>,
    /// This tensor's own record beside the buffer (see [`crate::TrackedBytes::handles`]).
    pub(crate) handle: Handle,
}

impl<P: Clone> Clone for TrackedTensor<P> {
    /// The inner tensor is cloned as inside an op of the backend: what its clone allocates (its
    /// own shape and strides) is the tensor's, not a record beside it.
    fn clone(&self) -> Self {
        let _backend = trainmem_probe::BackendScope::enter();
        TrackedTensor {
            inner: self.inner.clone(),
            token: self.token.clone(),
            handle: self.handle.clone(),
        }
    }
}

impl<P> TrackedTensor<P> {
    /// The inner backend's tensor.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Bytes of the buffer this tensor holds (shared with every view and clone of it).
    pub fn buffer_bytes(&self) -> u64 {
        self.token.as_ref().map_or(0, |t| t.bytes())
    }

    /// The inner tensor and the token, which the caller keeps alive until the op's outputs are
    /// wrapped (so an output holding the same buffer finds its count).
    pub(crate) fn into_parts(self) -> (P, Option<Keep>) {
        (self.inner, self.token)
    }
}

impl<P: std::fmt::Debug> std::fmt::Debug for TrackedTensor<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedTensor")
            .field("inner", &self.inner)
            .field("buffer_bytes", &self.buffer_bytes())
            .finish()
    }
}

impl<P: TensorMetadata> TensorMetadata for TrackedTensor<P> {
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }

    fn shape(&self) -> Shape {
        self.inner.shape()
    }

    fn rank(&self) -> usize {
        self.inner.rank()
    }
}

impl<P: QTensorPrimitive> QTensorPrimitive for TrackedTensor<P> {
    fn scheme(&self) -> &QuantScheme {
        self.inner.scheme()
    }

    fn acc_precision(&self) -> QuantAcc {
        self.inner.acc_precision()
    }

    fn propagation(&self) -> QuantPropagation {
        self.inner.propagation()
    }

    fn default_scheme() -> QuantScheme {
        P::default_scheme()
    }
}

/// What one op consumed, until its outputs are wrapped (a fixed array per thread, so it never
/// allocates; a ninth input is simply not remembered).
///
/// * The inputs' records ([`Handle`]), each with its key ([`crate::BufferInfo::handle_key`]):
///   an output that kept an input's record (an in-place result keeps its input's shape and
///   strides) takes the input's count and category with it.
/// * The buffers of inputs no other tensor held (their token had one holder), with their
///   shape: once the op has consumed such an input its buffer may be freed inside the op, and
///   a new buffer may then start at the same address. An output of another shape than that
///   input can only be such a new buffer (an in-place result keeps its input's shape; view ops
///   are told apart by name), so it is counted as new bytes instead of joining the old count.
struct Stash {
    handles: [(u64, Option<Handle>); 8],
    consumed: [(u64, u64); 8],
}

thread_local! {
    static STASH: std::cell::RefCell<Stash> = const {
        std::cell::RefCell::new(Stash {
            handles: [const { (0, None) }; 8],
            consumed: [(0, 0); 8],
        })
    };
}

fn stash(key: u64, handle: Handle) {
    if key == 0 || !handle.counts() {
        return;
    }
    let left = STASH
        .try_with(|s| {
            let mut s = s.borrow_mut();
            match s.handles.iter_mut().find(|slot| slot.1.is_none()) {
                Some(slot) => {
                    *slot = (key, Some(handle));
                    None
                }
                None => Some(handle),
            }
        })
        .ok()
        .flatten();
    drop(left);
}

fn take_stashed(key: u64) -> Option<Handle> {
    if key == 0 {
        return None;
    }
    STASH
        .try_with(|s| {
            let mut s = s.borrow_mut();
            s.handles
                .iter_mut()
                .find(|slot| slot.0 == key && slot.1.is_some())
                .and_then(|slot| slot.1.take())
        })
        .ok()
        .flatten()
}

/// A signature of a shape (its rank and dimensions).
fn shape_signature(shape: &Shape) -> u64 {
    shape.iter().fold(shape.num_dims() as u64, |h, &d| {
        (h ^ d as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Remembers that the op consumed the only holder of buffer `key`, of shape `signature`.
fn consumed_unique(key: u64, signature: u64) {
    let _ = STASH.try_with(|s| {
        let mut s = s.borrow_mut();
        if let Some(slot) = s.consumed.iter_mut().find(|slot| slot.0 == 0) {
            *slot = (key, signature);
        }
    });
}

/// Whether an output holding buffer `key` is a new buffer at the address of an input the op
/// consumed (see [`Stash`]); the output's shape signature is computed only when an input of
/// that key was consumed.
fn reuses_address(key: u64, signature: impl FnOnce() -> u64) -> bool {
    let consumed = STASH
        .try_with(|s| {
            s.borrow()
                .consumed
                .iter()
                .find(|&&(k, _)| k == key)
                .map(|&(_, sig)| sig)
        })
        .ok()
        .flatten();
    consumed.is_some_and(|sig| sig != signature())
}

/// The span of one op of [`crate::Tracked`]: the thread runs inside the backend meanwhile
/// ([`trainmem_probe::BackendScope`]: what the op allocates is the backend's); when it ends
/// (normally or by a panic), the records of the inputs no output kept are released.
pub(crate) struct OpScope {
    _backend: trainmem_probe::BackendScope,
}

impl OpScope {
    /// Opens the span.
    pub(crate) fn enter() -> OpScope {
        OpScope {
            _backend: trainmem_probe::BackendScope::enter(),
        }
    }

    /// Opens the span of an op that makes a tensor from the host data `data`: a new buffer at
    /// the data's address took the caller's block over (see [`crate::BufferInfo::adoptable`]).
    pub(crate) fn from_data(data: &burn::tensor::TensorData) -> OpScope {
        crate::ledger::adopting(data.bytes.as_ptr() as usize as u64);
        OpScope::enter()
    }
}

impl Drop for OpScope {
    fn drop(&mut self) {
        crate::ledger::adopting_done();
        let _ = STASH.try_with(|s| {
            let mut s = s.borrow_mut();
            for slot in s.handles.iter_mut() {
                slot.0 = 0;
                drop(slot.1.take());
            }
            s.consumed = [(0, 0); 8];
        });
    }
}

/// Bytes of a tensor stored densely: the view rule's size of a new buffer.
pub(crate) fn dense_bytes(shape: &Shape, dtype: DType) -> u64 {
    let size = match dtype {
        // One byte per quantized value (scales not counted).
        DType::QFloat(_) => 1,
        other => other.size() as u64,
    };
    shape.num_elements() as u64 * size
}

macro_rules! wrap_fn {
    ($name:ident, $prim:ident, $buffer:ident) => {
        /// Wraps an inner output, counting its buffer (see [`crate::ledger`]).
        pub(crate) fn $name<B: TrackableBackend>(
            inner: B::$prim,
            view_of: Option<&Keep>,
        ) -> TrackedTensor<B::$prim> {
            let info = B::$buffer(&inner);
            let handle = info
                .and_then(|i| take_stashed(i.handle_key))
                .unwrap_or_else(|| Handle::new(info.map_or(0, |i| i.handle_bytes)));
            let fresh = view_of.is_none()
                && info.is_some_and(|i| reuses_address(i.key, || shape_signature(&inner.shape())));
            let token = track(info, view_of, fresh, || {
                dense_bytes(&inner.shape(), inner.dtype())
            });
            TrackedTensor {
                inner,
                token,
                handle,
            }
        }
    };
}

wrap_fn!(wrap_float, FloatTensorPrimitive, float_buffer);
wrap_fn!(wrap_int, IntTensorPrimitive, int_buffer);
wrap_fn!(wrap_bool, BoolTensorPrimitive, bool_buffer);
wrap_fn!(wrap_q, QuantizedTensorPrimitive, quantized_buffer);

macro_rules! unwrap_fn {
    ($name:ident, $prim:ident, $buffer:ident) => {
        /// Unwraps an op's input: the inner tensor and its buffer's token; its record waits in
        /// the op's stash for an output that keeps it.
        pub(crate) fn $name<B: TrackableBackend>(
            t: TrackedTensor<B::$prim>,
        ) -> (B::$prim, Option<Keep>) {
            let TrackedTensor {
                inner,
                token,
                handle,
            } = t;
            let unique = token.as_ref().is_some_and(|t| Arc::strong_count(t) == 1);
            if handle.counts() || unique {
                if let Some(info) = B::$buffer(&inner) {
                    if unique {
                        consumed_unique(info.key, shape_signature(&inner.shape()));
                    }
                    stash(info.handle_key, handle);
                }
            }
            (inner, token)
        }
    };
}

unwrap_fn!(unwrap_float, FloatTensorPrimitive, float_buffer);
unwrap_fn!(unwrap_int, IntTensorPrimitive, int_buffer);
unwrap_fn!(unwrap_bool, BoolTensorPrimitive, bool_buffer);
unwrap_fn!(unwrap_q, QuantizedTensorPrimitive, quantized_buffer);

/// A float-or-quantized primitive of the inner backend, and its token.
pub(crate) fn unwrap_primitive<B: TrackableBackend>(
    t: TensorPrimitive<Tracked<B>>,
) -> (TensorPrimitive<B>, Option<Keep>) {
    match t {
        TensorPrimitive::Float(t) => {
            let (t, k) = t.into_parts();
            (TensorPrimitive::Float(t), k)
        }
        TensorPrimitive::QFloat(t) => {
            let (t, k) = t.into_parts();
            (TensorPrimitive::QFloat(t), k)
        }
    }
}

/// Wraps a float-or-quantized output.
pub(crate) fn wrap_primitive<B: TrackableBackend>(
    t: TensorPrimitive<B>,
) -> TensorPrimitive<Tracked<B>> {
    match t {
        TensorPrimitive::Float(t) => TensorPrimitive::Float(wrap_float::<B>(t, None)),
        TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(wrap_q::<B>(t, None)),
    }
}

/// Quantization parameters for the inner backend, and the scales' token.
pub(crate) fn unwrap_qparams<B: TrackableBackend>(
    p: QuantizationParametersPrimitive<Tracked<B>>,
) -> (QuantizationParametersPrimitive<B>, Option<Keep>) {
    let (scales, k) = p.scales.into_parts();
    (QuantizationParametersPrimitive { scales }, k)
}

/// A transaction for the inner backend, and every read tensor's token.
pub(crate) fn unwrap_transaction<B: TrackableBackend>(
    t: TransactionPrimitive<Tracked<B>>,
) -> (TransactionPrimitive<B>, Vec<Option<Keep>>) {
    fn split<P>(tensors: Vec<TrackedTensor<P>>, keep: &mut Vec<Option<Keep>>) -> Vec<P> {
        tensors
            .into_iter()
            .map(|t| {
                let (t, k) = t.into_parts();
                keep.push(k);
                t
            })
            .collect()
    }
    let mut keep = Vec::new();
    let floats = split(t.read_floats, &mut keep);
    let qfloats = split(t.read_qfloats, &mut keep);
    let ints = split(t.read_ints, &mut keep);
    let bools = split(t.read_bools, &mut keep);
    (
        TransactionPrimitive::new(floats, qfloats, ints, bools),
        keep,
    )
}
