//! Test support shared by custody's crates: the emulated driver's typed client ([`emu`]) and,
//! with the `helpers` feature, the helpers the integration tests of `handles` and `memory`
//! share (the emulator when it is the loaded driver, skip helpers, the pretend-real-driver
//! switch, test serialisation, captured cleanup reports) and `stream_ops` (a stream held by a
//! stream memory operation, to show on any driver when a free runs). [`stacks`]: every thread's
//! backtrace on stderr when the GPU runner signals a hung test process.
//!
//! The same tests run against the emulated driver (`CUSTODY_CUDA_DRIVER=.../libcuda_emu.so`)
//! and against a real one (the GPU bundle). What any driver shows is asserted everywhere; what
//! only the emulator can show (its call log, hazards, live allocations, fault injection) is
//! asserted inside `with_emulator` (a helper), whose [`Emulator`](emu::Emulator) value exists nowhere
//! else, so the compiler keeps every such query inside it (docs/testing.md).

pub mod emu;
pub mod stacks;

#[cfg(feature = "helpers")]
mod helpers;
#[cfg(feature = "helpers")]
pub mod stream_ops;

#[cfg(feature = "helpers")]
pub use helpers::*;
