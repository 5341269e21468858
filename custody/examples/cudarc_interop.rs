//! custody next to cudarc: a cudarc stream wrapped as a custody stream (custody allocates,
//! copies and frees on it), and a custody buffer's device pointer passed to a kernel that
//! cudarc launches. Checks the kernel's result and exits non-zero when a check fails.
//!
//! Kernel launches are not emulated, and cudarc loads the system's `libcuda.so` itself: when
//! `CUSTODY_CUDA_DRIVER` names another library (the emulated driver), custody and cudarc would
//! be talking to two different drivers, so the example says it skipped and exits 0. On a GPU
//! host (the bundle's real-driver run) it runs. Needs the `cudarc` feature:
//! `cargo run -p cuda-custody --features cudarc --example cudarc_interop`.

use std::process::ExitCode;

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use custody::{DeviceMemoryResource, MemoryResource};

/// `scale(float *data, float factor, unsigned n)`: `data[i] *= factor` for `i < n`. Plain PTX,
/// so no NVRTC is needed; the driver compiles it for the device.
const PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry scale(
    .param .u64 data,
    .param .f32 factor,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [data];
    ld.param.f32 %f1, [factor];
    ld.param.u32 %r2, [n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f2, [%rd4];
    mul.f32 %f3, %f2, %f1;
    st.global.f32 [%rd4], %f3;
DONE:
    ret;
}
"#;

const N: usize = 4096;

fn main() -> ExitCode {
    if let Some(library) = std::env::var_os("CUSTODY_CUDA_DRIVER").filter(|v| !v.is_empty()) {
        println!(
            "cudarc_interop: skipped: custody loads {} (CUSTODY_CUDA_DRIVER) and cudarc the \
             system's libcuda.so, and kernel launches are not emulated; run on a GPU host",
            library.to_string_lossy()
        );
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => {
            println!("cudarc_interop: every check passed");
            ExitCode::SUCCESS
        }
        Err(error) => {
            println!("cudarc_interop: FAILED: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let context = CudaContext::new(0)?;
    let theirs = context.new_stream()?;
    // cudarc's stream, as custody's: allocations, copies and the free are ordered on it.
    let ours = custody::cudarc::stream(&theirs)?;
    let mr = DeviceMemoryResource::new(0)?;
    let mut buffer = mr.allocate(N * 4, &ours)?;
    let data: Vec<f32> = (0..N).map(|i| i as f32).collect();
    buffer
        .as_slice_mut::<f32>()?
        .copy_from_slice(&data, &ours)?;

    let module = context.load_module(Ptx::from_src(PTX))?;
    let scale = module.load_function("scale")?;
    let ptr = buffer.as_slice_mut::<f32>()?.device_ptr();
    let (factor, n) = (2.5f32, N as u32);
    let mut launch = theirs.launch_builder(&scale);
    launch.arg(&ptr).arg(&factor).arg(&n);
    // SAFETY: `scale` takes (float *, float, unsigned), as pushed; `ptr` names `N` floats of a
    // live buffer, which stays allocated until its free, ordered on this same stream after
    // the kernel.
    unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;

    let back = buffer.as_slice::<f32>()?.to_vec(&ours)?;
    let expected: Vec<f32> = data.iter().map(|v| v * factor).collect();
    if back != expected {
        return Err("the kernel's result differs from data * factor".into());
    }
    println!("  ok: cudarc's kernel scaled custody's buffer, on cudarc's stream");
    // custody's recipe keeps cudarc's stream alive: drop cudarc's reference first.
    drop(theirs);
    drop(buffer);
    ours.synchronize()?;
    println!("  ok: the free ran on the wrapped stream after cudarc let go of it");
    Ok(())
}
