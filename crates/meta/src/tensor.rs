//! The Meta tensor primitives: shape, dtype and a shared buffer handle, no data.
//!
//! The storage rules follow burn's CPU backend (Flex) in its main lines:
//!
//! * **views share the buffer**: reshape of a contiguous tensor, permute/swap_dims, flip,
//!   expand, slice and unfold return a tensor that shares the input's buffer (no new bytes);
//!   reshaping a non-contiguous tensor copies it into a fresh buffer;
//! * **in place when uniquely owned**: an element-wise op (unary, with a scalar, or binary with
//!   an output the shape and dtype of its left operand) writes into its input when that input's
//!   buffer has no other owner and is contiguous from offset 0; otherwise it allocates;
//! * everything else allocates a fresh buffer for its output.
//!
//! A buffer is sized `elements × dtype size` (bool: 1 byte per element).

use std::sync::Arc;

use burn::tensor::backend::QTensorPrimitive;
use burn::tensor::quantization::QuantScheme;
use burn::tensor::{DType, Shape, TensorMetadata};

use crate::device::MetaDevice;
use crate::memory::Buffer;

/// The size of a measured run's tensor primitive: a Flex tensor under trainmem-track's
/// tracker (`Autodiff<Tracked<Flex>>`, as measured runs train).
pub const MEASURED_PRIMITIVE_SIZE: usize =
    std::mem::size_of::<trainmem_track::TrackedTensor<burn::backend::flex::FlexTensor>>();

/// The fields a Meta tensor needs.
#[derive(Debug, Clone)]
struct Fields {
    shape: Shape,
    dtype: DType,
    device: MetaDevice,
    buffer: Arc<Buffer>,
    /// Row-major contiguous within its buffer.
    contiguous: bool,
    /// Starts at the first byte of its buffer.
    at_origin: bool,
}

/// How many bytes bring a [`MetaTensor`] to [`MEASURED_PRIMITIVE_SIZE`].
const PADDING: usize = MEASURED_PRIMITIVE_SIZE.saturating_sub(std::mem::size_of::<Fields>());

/// Bytes that bring a [`MetaTensor`] to [`MEASURED_PRIMITIVE_SIZE`].
#[derive(Clone, Copy)]
struct Padding([u8; PADDING]);

impl Default for Padding {
    fn default() -> Padding {
        Padding([0; PADDING])
    }
}

impl std::fmt::Debug for Padding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} B", self.0.len())
    }
}

/// A tensor of the Meta backend (float, int and bool tensors alike).
///
/// It has the size of a measured run's tensor ([`MEASURED_PRIMITIVE_SIZE`]): burn keeps tensor
/// primitives inline in the records it allocates beside them (every autodiff node's saved
/// state, the gradients' container), so the host records of a run on Meta take the bytes they
/// take in a measured run.
#[derive(Debug, Clone)]
pub struct MetaTensor {
    fields: Fields,
    _padding: Padding,
}

/// Bytes of a tensor of `shape` and `dtype` as the CPU backend stores it.
pub fn tensor_bytes(shape: &Shape, dtype: DType) -> u64 {
    let size = match dtype {
        // Flex stores quantized values as one i8 per element.
        DType::QFloat(_) => 1,
        other => other.size(),
    };
    (shape.num_elements() * size) as u64
}

impl MetaTensor {
    /// A tensor with a fresh buffer on `device`, counted under the calling thread's category.
    pub fn new(shape: Shape, dtype: DType, device: MetaDevice) -> MetaTensor {
        let bytes = tensor_bytes(&shape, dtype);
        // Meta's own structures (and a memory model's) are the backend's host bytes, not
        // records the framework keeps beside its tensors.
        let buffer = {
            let _backend = trainmem_probe::BackendScope::enter();
            Arc::new(Buffer::new(device.ledger(), bytes))
        };
        MetaTensor {
            fields: Fields {
                buffer,
                shape,
                dtype,
                device,
                contiguous: true,
                at_origin: true,
            },
            _padding: Padding::default(),
        }
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> MetaDevice {
        self.fields.device
    }

    /// Bytes of the buffer this tensor uses (shared with its views).
    pub fn buffer_bytes(&self) -> u64 {
        self.fields.buffer.bytes()
    }

    /// The category the tensor's buffer was counted under.
    pub fn category(&self) -> trainmem_core::Category {
        self.fields.buffer.category()
    }

    /// Names the tensor's buffer while it is alive (its address): equal for two tensors exactly
    /// when they share the buffer.
    pub fn buffer_key(&self) -> u64 {
        Arc::as_ptr(&self.fields.buffer) as usize as u64
    }

    /// Whether no other tensor uses this tensor's buffer.
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.fields.buffer) == 1
    }

    /// A fresh tensor on the same device.
    pub(crate) fn fresh(&self, shape: Shape, dtype: DType) -> MetaTensor {
        MetaTensor::new(shape, dtype, self.fields.device)
    }

    /// Whether an element-wise op may write into this tensor's buffer.
    fn writable_in_place(&self) -> bool {
        self.is_unique() && self.fields.contiguous && self.fields.at_origin
    }

    /// A view of this tensor's buffer with another shape and layout.
    pub(crate) fn view(self, shape: Shape, contiguous: bool, at_origin: bool) -> MetaTensor {
        MetaTensor {
            fields: Fields {
                shape,
                contiguous,
                at_origin,
                ..self.fields
            },
            ..self
        }
    }

    /// A view that keeps the layout flags (reshape of a contiguous tensor).
    pub(crate) fn reshaped(self, shape: Shape) -> MetaTensor {
        if self.fields.contiguous {
            let at_origin = self.fields.at_origin;
            self.view(shape, true, at_origin)
        } else {
            self.fresh(shape, self.fields.dtype)
        }
    }

    /// The output of an element-wise op on this tensor alone, of dtype `dtype`.
    pub(crate) fn map(self, dtype: DType) -> MetaTensor {
        if dtype == self.fields.dtype && self.writable_in_place() {
            self
        } else {
            self.fresh(self.fields.shape.clone(), dtype)
        }
    }

    /// The output of an element-wise op writing into this tensor when it can (`shape` is the
    /// output shape, e.g. after broadcasting).
    pub(crate) fn map_into(self, shape: Shape, dtype: DType) -> MetaTensor {
        if shape == self.fields.shape && dtype == self.fields.dtype && self.writable_in_place() {
            self
        } else {
            self.fresh(shape, dtype)
        }
    }

    /// Moves the tensor to `device` (a fresh buffer there unless it already lives there).
    pub(crate) fn moved_to(self, device: MetaDevice) -> MetaTensor {
        if device == self.fields.device {
            self
        } else {
            MetaTensor::new(self.fields.shape, self.fields.dtype, device)
        }
    }
}

impl TensorMetadata for MetaTensor {
    fn dtype(&self) -> DType {
        self.fields.dtype
    }

    fn shape(&self) -> Shape {
        self.fields.shape.clone()
    }

    fn rank(&self) -> usize {
        self.fields.shape.num_dims()
    }
}

/// A quantized tensor of the Meta backend: its values as an i8 [`MetaTensor`] and its scheme.
#[derive(Debug, Clone)]
pub struct MetaQTensor {
    pub(crate) values: MetaTensor,
    pub(crate) scheme: QuantScheme,
}

impl MetaQTensor {
    /// The tensor holding the quantized values.
    pub fn values(&self) -> &MetaTensor {
        &self.values
    }

    /// Applies a layout op to the values, keeping the scheme.
    pub(crate) fn map_values(self, f: impl FnOnce(MetaTensor) -> MetaTensor) -> MetaQTensor {
        MetaQTensor {
            values: f(self.values),
            scheme: self.scheme,
        }
    }
}

impl QTensorPrimitive for MetaQTensor {
    fn scheme(&self) -> &QuantScheme {
        &self.scheme
    }

    fn default_scheme() -> QuantScheme {
        QuantScheme::default().with_store(burn::tensor::quantization::QuantStore::Native)
    }
}

impl TensorMetadata for MetaQTensor {
    fn dtype(&self) -> DType {
        DType::QFloat(self.scheme)
    }

    fn shape(&self) -> Shape {
        self.values.shape()
    }

    fn rank(&self) -> usize {
        self.values.rank()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meta_tensor_has_a_measured_runs_size() {
        assert_eq!(std::mem::size_of::<MetaTensor>(), MEASURED_PRIMITIVE_SIZE);
        let t = MetaTensor::new(Shape::new([2, 3]), DType::F32, MetaDevice::new());
        assert_eq!(t.buffer_bytes(), 24);
        let shown = format!("{t:?}");
        assert!(shown.contains(&format!("_padding: {PADDING} B")), "{shown}");
    }
}
