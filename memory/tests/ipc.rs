//! IPC between two processes (docs/reference-notes.md section 5, "IPC import"): a parent exports
//! an IPC-enabled pool (a POSIX file descriptor, passed with `SCM_RIGHTS` over a unix socket)
//! and a buffer's descriptor; a child — this test binary run again — imports the buffer with an
//! explicit stream, reads what the parent wrote, writes back through the shared memory, and
//! frees its import on its own recipe. Assertions go through the bytes, so the same test runs on
//! the emulator (shared-memory backed pools) and on a GPU; the emulator's hazard checker is
//! consulted only when it is the loaded driver.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::sync::Arc;

use handles::{ContextHandle, StreamFlags, StreamHandle};
use memory::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, IpcBufferDescriptor, MemoryError,
    MemoryResource, PoolMemoryResource,
};
use sendfd::{RecvWithFd, SendWithFd};
use test_support::emu::Emulator;

/// Set in the child process to the path of the parent's socket.
const CHILD: &str = "CUSTODY_MEMORY_IPC_CHILD";
const SIZE: usize = 64 << 10;

fn stream() -> StreamHandle {
    StreamHandle::create(
        &ContextHandle::primary(0).expect("device 0"),
        StreamFlags::DEFAULT,
        0,
    )
    .expect("stream")
}

fn ipc_resource() -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            max_size: 0,
            ipc_enabled: true,
        },
    )
    .expect("an IPC-enabled pool")
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..SIZE)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn read(buffer: &Buffer, stream: &StreamHandle) -> Vec<u8> {
    let mut bytes = vec![0u8; buffer.size()];
    buffer
        .copy_to_host(&mut bytes, stream)
        .expect("copy to host");
    bytes
}

fn no_hazards() {
    if let Some(emu) = Emulator::get() {
        let hazards = emu.hazards();
        assert!(hazards.is_empty(), "hazards: {hazards:#?}");
    }
}

#[test]
fn two_processes_share_a_pool_buffer() {
    if let Some(path) = std::env::var_os(CHILD) {
        return child(&path);
    }
    if let Some(emu) = Emulator::get() {
        emu.clear_hazards();
    }
    let s = stream();
    let mr = ipc_resource();
    let buffer = mr.allocate(SIZE, &s).unwrap();
    buffer.copy_from_host(&pattern(1), &s).unwrap();
    let descriptor = buffer.ipc_descriptor().unwrap();
    assert_eq!(descriptor.size(), SIZE);
    assert_eq!(descriptor.device_id(), Some(0));
    let pool_fd = mr.export_pool().unwrap();

    let path = std::env::temp_dir().join(format!("custody-ipc-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "two_processes_share_a_pool_buffer",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let mut connection = loop {
        match listener.accept() {
            Ok((connection, _)) => break connection,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if child.try_wait().unwrap().is_some() {
                    let output = child.wait_with_output().unwrap();
                    panic!(
                        "the child exited before connecting: {}",
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let _ = std::fs::remove_file(&path);
    connection.set_nonblocking(false).unwrap();
    let sent = connection
        .send_with_fd(&descriptor.to_bytes(), &[pool_fd.as_raw_fd()])
        .unwrap();
    assert_eq!(sent, IpcBufferDescriptor::LEN);
    drop(pool_fd); // the child has its own descriptor now
    let mut reply = String::new();
    connection.read_to_string(&mut reply).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success() && reply == "ok",
        "child failed ({}), replied {reply:?}:\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The child wrote through the shared pool, and freed its imports first.
    assert_eq!(read(&buffer, &s), pattern(2));
    buffer.close().unwrap();
    no_hazards();
}

/// The importing side: runs in the child process.
fn child(path: &std::ffi::OsStr) {
    let mut connection = UnixStream::connect(path).expect("connect to the parent");
    let mut bytes = [0u8; 2 * IpcBufferDescriptor::LEN];
    let mut fds = [-1; 1];
    let (n, nfds) = connection.recv_with_fd(&mut bytes, &mut fds).unwrap();
    assert_eq!((n, nfds), (IpcBufferDescriptor::LEN, 1));
    // SAFETY: `recv_with_fd` reported one descriptor received with SCM_RIGHTS; it is new in
    // this process and owned by nobody else.
    let pool_fd = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    let descriptor = IpcBufferDescriptor::from_bytes(&bytes[..n]).unwrap();

    let (s1, s2) = (stream(), stream());
    let mr = DeviceMemoryResource::import_pool(0, pool_fd.as_fd()).unwrap();
    drop(pool_fd);
    assert!(mr.is_mapped());
    assert!(matches!(mr.allocate(256, &s1), Err(MemoryError::Ipc(_))));
    assert!(matches!(mr.export_pool(), Err(MemoryError::Ipc(_))));

    // Bad descriptors and resources: refused, nothing imported for good.
    let mut oversized = descriptor.to_bytes();
    oversized[24..32].copy_from_slice(&((SIZE as u64) + (1 << 30)).to_le_bytes());
    let oversized = IpcBufferDescriptor::from_bytes(&oversized).unwrap();
    assert!(matches!(
        Buffer::from_ipc_descriptor(&mr, &oversized, &s1),
        Err(MemoryError::Ipc(_))
    ));
    let mut other_device = descriptor.to_bytes();
    other_device[16..20].copy_from_slice(&1i32.to_le_bytes());
    let other_device = IpcBufferDescriptor::from_bytes(&other_device).unwrap();
    assert_eq!(
        Buffer::from_ipc_descriptor(&mr, &other_device, &s1).map(|_| ()),
        Err(MemoryError::Handle(handles::HandleError::WrongDevice {
            expected: 0,
            found: 1
        }))
    );
    let not_imported = DeviceMemoryResource::new(0).unwrap();
    assert!(matches!(
        Buffer::from_ipc_descriptor(&not_imported, &descriptor, &s1),
        Err(MemoryError::Ipc(_))
    ));

    // Two imports, each with its own recipe.
    let first = Buffer::from_ipc_descriptor(&mr, &descriptor, &s1).unwrap();
    let second = Buffer::from_ipc_descriptor(&mr, &descriptor, &s2).unwrap();
    assert!(first.is_mapped() && second.is_mapped());
    assert!(first.deallocation_stream().unwrap().ptr_eq(&s1));
    assert!(second.deallocation_stream().unwrap().ptr_eq(&s2));
    assert!(matches!(first.ipc_descriptor(), Err(MemoryError::Ipc(_))));
    assert_eq!(read(&first, &s1), pattern(1), "the parent's bytes");
    first.copy_from_host(&pattern(2), &s1).unwrap();
    assert_eq!(read(&second, &s2), pattern(2), "one memory, two imports");
    first.close().unwrap();
    second.close().unwrap();
    // Frees in importing processes must complete before the exporter frees.
    s1.synchronize().unwrap();
    s2.synchronize().unwrap();
    no_hazards();
    connection.write_all(b"ok").unwrap();
}

#[test]
fn export_needs_an_ipc_enabled_pool() {
    let s = stream();
    let plain =
        DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default()).unwrap();
    assert!(matches!(plain.export_pool(), Err(MemoryError::Ipc(_))));
    let buffer = plain.allocate(256, &s).unwrap();
    assert!(matches!(buffer.ipc_descriptor(), Err(MemoryError::Ipc(_))));
    // A closed buffer is gone: asking it for a descriptor does not compile (the Rust buffer's
    // `close` consumes it); the Python layer's closed state is tested by pybind's tests.
    buffer.close().unwrap();
}
