//! [`TwinDevice`]: what the twin takes from the device measured runs are made on, so that a
//! run on burn's cubecl backends is predicted as that device runs it.

use trainmem_burn::BackendChoice;
use trainmem_core::ByteSize;
use trainmem_core::plan::{DeviceKind, Framework, Plan};

/// burn's fusion and cubecl's buffer alignment on the device of the measured runs: the
/// twin's plan gets them as `[device] fusion` and `alignment`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TwinDevice {
    /// The runs use burn's `fusion` feature.
    pub fusion: bool,
    /// cubecl's allocation alignment in bytes, where it is not cubecl-cuda's 512 B (wgpu:
    /// the adapter's uniform offset alignment).
    pub alignment: Option<u64>,
}

impl TwinDevice {
    /// The device `backend` trains on in this build: fused where burn's `fusion` feature is
    /// built in; on wgpu, the adapter's alignment (none when no adapter is found: the run
    /// then fails with the adapter's error).
    pub fn of_build(backend: BackendChoice) -> TwinDevice {
        match backend {
            BackendChoice::Flex => TwinDevice::default(),
            BackendChoice::Cuda => TwinDevice {
                fusion: trainmem_burn::FUSION,
                alignment: None,
            },
            BackendChoice::Wgpu => TwinDevice {
                fusion: trainmem_burn::FUSION,
                alignment: wgpu_alignment(),
            },
        }
    }

    /// The device a committed `gpu-check` recorded: its backend as `gpu-check.json` names it
    /// (`cuda`, `cuda-fusion`, `wgpu`, `wgpu-fusion`, `flex`) and, on wgpu, the alignment its
    /// pools were predicted with. `None` for a backend name not known.
    pub fn recorded(backend: &str, alignment: Option<u64>) -> Option<(BackendChoice, TwinDevice)> {
        let (name, fusion) = match backend.strip_suffix("-fusion") {
            Some(name) => (name, true),
            None => (backend, false),
        };
        let choice: BackendChoice = name.parse().ok()?;
        let alignment = (choice == BackendChoice::Wgpu)
            .then_some(alignment)
            .flatten();
        Some((choice, TwinDevice { fusion, alignment }))
    }

    /// `plan` as the twin runs it on this device: burn's plans get the fusion and alignment
    /// (a plan of another framework, or on a CPU, is left as it is).
    pub fn apply(&self, plan: &mut Plan) {
        if plan.framework != Framework::Burn || plan.device.kind == DeviceKind::Cpu {
            return;
        }
        plan.device.fusion = self.fusion;
        if let Some(a) = self.alignment {
            plan.device.alignment = Some(ByteSize(a));
        }
    }
}

#[cfg(feature = "wgpu")]
fn wgpu_alignment() -> Option<u64> {
    trainmem_burn::wgpu_adapter().ok().map(|a| a.alignment)
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_alignment() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_backend_names_its_fusion_and_keeps_wgpus_alignment_only() {
        let (b, d) = TwinDevice::recorded("wgpu-fusion", Some(32)).expect("known");
        assert_eq!(b, BackendChoice::Wgpu);
        assert_eq!(
            d,
            TwinDevice {
                fusion: true,
                alignment: Some(32)
            }
        );
        let (b, d) = TwinDevice::recorded("cuda", Some(512)).expect("known");
        assert_eq!(b, BackendChoice::Cuda);
        assert_eq!(d, TwinDevice::default());
        assert!(TwinDevice::recorded("tpu", None).is_none());
    }

    #[test]
    fn only_burns_gpu_plans_take_the_device() {
        let device = TwinDevice {
            fusion: true,
            alignment: Some(32),
        };
        let mut plan = crate::plans::load("optimizer-jump").expect("a scenario plan");
        assert_eq!(plan.framework, Framework::Burn);
        plan.device.kind = DeviceKind::Cuda;
        device.apply(&mut plan);
        assert!(plan.device.fusion);
        assert_eq!(plan.device.alignment, Some(ByteSize(32)));
        plan.validate().expect("a burn GPU plan may carry both");
        let mut torch = plan.clone();
        torch.framework = Framework::Pytorch;
        torch.device.fusion = false;
        torch.device.alignment = None;
        device.apply(&mut torch);
        assert!(!torch.device.fusion && torch.device.alignment.is_none());
    }
}
