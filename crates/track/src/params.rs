//! [`materialize`]: create a module's lazy parameters now, under the calling thread's category.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// Creates every lazily initialised parameter of `module` now, so its bytes are allocated (and
/// tagged) under the calling thread's current category instead of during the first forward.
pub fn materialize<B: Backend, M: Module<B>>(module: &M) {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            let _ = param.val();
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, burn::tensor::Bool>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Touch);
}
