//! A new Rust user's first custody program: allocate device memory, copy in and out through
//! typed slices, hand a buffer over from one stream to another, drop one on a thread that has
//! no CUDA context, let a CUDA graph keep a closed buffer alive, and adopt memory custody did
//! not allocate. Each step checks what it claims; the program exits non-zero when a check
//! fails.
//!
//! Runs on any driver custody loads (`CUSTODY_CUDA_DRIVER`, else `libcuda.so.1`): `cargo xtask
//! test` runs it on the emulated driver, the GPU bundle on the real one. By hand:
//! `CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so cargo run -p cuda-custody --example first_program`.

use std::process::ExitCode;

use custody::{
    cleanup_error_count, drain_deferred_cleanup, raw, Buffer, ContextHandle, DeviceMemoryResource,
    EventFlags, EventHandle, Graph, MemoryResource, StreamFlags, StreamHandle,
};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Elements per buffer.
const N: usize = 1024;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("first_program: every check passed");
            ExitCode::SUCCESS
        }
        Err(error) => {
            println!("first_program: FAILED: {error}");
            ExitCode::FAILURE
        }
    }
}

fn check(ok: bool, what: &str) -> Result {
    if ok {
        println!("  ok: {what}");
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}

fn run() -> Result {
    let errors_before = cleanup_error_count();
    // Device 0's primary context, and two streams in it. Nothing needs to be current: a
    // created stream carries its context.
    let context = ContextHandle::primary(0)?;
    let producer = StreamHandle::create(&context, StreamFlags::DEFAULT, 0)?;
    let consumer = StreamHandle::create(&context, StreamFlags::DEFAULT, 0)?;
    let mr = DeviceMemoryResource::new(0)?;

    println!("1. allocate, and copy in and out through typed slices");
    let data: Vec<f32> = (0..N).map(|i| i as f32 * 0.5).collect();
    let mut input = mr.allocate(N * 4, &producer)?;
    input
        .as_slice_mut::<f32>()?
        .copy_from_slice(&data, &producer)?;
    let mut output = mr.allocate(N * 4, &producer)?;
    // A device-to-device copy of the second half into the first half of `output`, then the
    // first half into the second (two views of one buffer, borrowed apart).
    {
        let source = input.as_slice::<f32>()?;
        let mut target = output.as_slice_mut::<f32>()?;
        let (mut low, mut high) = target.split_at_mut(N / 2)?;
        low.copy_from(&source.slice(N / 2..)?, &producer)?;
        high.copy_from(&source.slice(..N / 2)?, &producer)?;
    }
    let back = output.as_slice::<f32>()?.to_vec(&producer)?;
    let swapped: Vec<f32> = data[N / 2..]
        .iter()
        .chain(&data[..N / 2])
        .copied()
        .collect();
    check(back == swapped, "the halves came back swapped")?;
    input.close()?;

    println!("2. hand the buffer over from the producer stream to the consumer stream");
    output.as_slice_mut::<f32>()?.fill(1.0, &producer)?;
    let filled = EventHandle::create(&context, EventFlags::DISABLE_TIMING)?;
    filled.record(&producer)?;
    consumer.wait_event(&filled)?;
    let read = output.as_slice::<f32>()?.slice(..8)?.to_vec(&consumer)?;
    check(
        read == [1.0; 8],
        "the consumer read what the producer wrote",
    )?;
    // The consumer used it last: its free is ordered after the consumer's work.
    output.set_deallocation_stream(&consumer)?;
    check(
        output
            .deallocation_stream()
            .is_some_and(|stream| stream.ptr_eq(&consumer)),
        "the free is recorded on the consumer stream",
    )?;

    println!("3. drop it on a thread that has no CUDA context");
    let dropped = std::thread::spawn(move || {
        let had_context = ContextHandle::current().map(|c| c.is_some());
        drop(output);
        had_context
    })
    .join()
    .map_err(|_| "the dropping thread panicked")??;
    check(
        !dropped,
        "the thread had no context, and the drop needed none",
    )?;
    consumer.synchronize()?;

    println!("4. a graph keeps a closed buffer alive until it is done with it");
    let scratch = mr.allocate(N, &producer)?;
    let result = mr.allocate(N, &producer)?;
    let graph = Graph::new(0)?;
    let fill = graph.add_memset(&[], &scratch, 0x2au8)?;
    graph.add_memcpy(&[fill], &result, &scratch)?;
    scratch.close()?; // the graph still holds the memory
    graph.launch(&producer)?;
    let mut bytes = vec![0u8; N];
    result.copy_to_host(&mut bytes, &producer)?;
    check(
        bytes.iter().all(|&b| b == 0x2a),
        "the graph filled and copied the closed buffer",
    )?;
    graph.close();
    drain_deferred_cleanup(); // the graph's hold on the scratch buffer is released here
    result.close()?;

    println!("5. adopt memory custody did not allocate (a host vector, as a view)");
    let mut host = vec![0u16; 64];
    {
        // SAFETY: `host` outlives the view, and nothing reads or writes it until the view is
        // closed.
        let handle = unsafe { raw::borrowed(host.as_mut_ptr() as u64, host.len() * 2) };
        let view = Buffer::from_parts(handle, None);
        let mut device = mr.allocate(64 * 2, &producer)?;
        device.as_slice_mut::<u16>()?.fill(0xbeef, &producer)?;
        view.copy_from(&device, &producer)?;
        producer.synchronize()?;
        view.close()?; // frees nothing: the vector is the program's
        device.close()?;
    }
    check(
        host.iter().all(|&v| v == 0xbeef),
        "the device's bytes arrived in the vector",
    )?;

    producer.synchronize()?;
    check(
        cleanup_error_count() == errors_before,
        "no free failed along the way",
    )?;
    Ok(())
}
