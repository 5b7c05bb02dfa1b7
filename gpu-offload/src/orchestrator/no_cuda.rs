//! The CUDA processor in a build without the `cuda` feature: asking for it is an error that
//! says how to get it.

use core::convert::Infallible;
use core::fmt;

use urom_transport::Transport;

use crate::channel::ChannelParams;

/// Why the CUDA processor cannot run.
#[derive(Debug)]
pub enum CudaError {
    /// This build has no CUDA support.
    NotBuilt,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "CUDA processor unavailable: this build has no CUDA support (rebuild with \
             `--features cuda`)",
        )
    }
}

impl std::error::Error for CudaError {}

/// A GPU; none can exist in this build.
pub struct Gpu(Infallible);

impl Gpu {
    /// Always fails: this build has no CUDA support.
    pub fn open(_pci_addr: Option<&str>) -> Result<Self, CudaError> {
        Err(CudaError::NotBuilt)
    }
}

/// The CUDA processor; none can exist in this build.
pub struct CudaProcessor(Infallible);

impl CudaProcessor {
    /// Unreachable: no [`Gpu`] exists.
    pub fn start<T: Transport>(
        gpu: Gpu,
        _conns: Vec<T>,
        _params: &ChannelParams,
        _cpus: &[usize],
    ) -> Result<Self, CudaError> {
        match gpu.0 {}
    }

    /// Unreachable.
    pub fn check(&mut self) -> Result<(), CudaError> {
        match self.0 {}
    }

    /// Unreachable.
    pub fn stop(self) {
        match self.0 {}
    }
}
