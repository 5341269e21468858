//! Pool IPC: what a real driver was seen to do with pools exportable as a POSIX file
//! descriptor, measured on an NVIDIA H200 (driver 580.159.04) while building the memory crate's
//! IPC (`handles::create_pool`, `memory/src/ipc.rs`).
//!
//! - A pointer of an IPC-capable pool cannot be exported (`cuMemPoolExportPointer` returns
//!   `CUDA_ERROR_INVALID_VALUE`) until the pool itself has been exported once with
//!   `cuMemPoolExportToShareableHandle`; after that it can.
//! - In an importing process, a second `cuMemPoolImportPointer` of the same export data from the
//!   same imported pool gives the same mapping: the same address, and the first
//!   `cuMemFreeAsync` unmaps it for both, so freeing the second address afterwards returns
//!   `CUDA_ERROR_INVALID_VALUE`. (The H200 run saw the second free fail but did not compare the
//!   addresses; the equality asserted here is inferred from that failure until this case has run
//!   on a GPU.)
//!
//! The second fact takes two processes: the case runs this test binary again as a child
//! (`<binary> --exact <case> --test-threads=1`, as the GPU runner runs every case), with
//! [`CHILD`] set and one end of a unix socket pair as its standard input. The parent sends the
//! pool's descriptor (`SCM_RIGHTS`) and the 64 bytes of export data over it; the child answers
//! `ok` when every assertion held, so a child that ran no test cannot pass for one that did.
//!
//! Not here: whether a process may import its own exported pool descriptor
//! (`cuMemPoolImportFromShareableHandle` of its own export). No driver was asked yet, and a case
//! that asserts nothing about it would measure nothing.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use cuda_sys::CudaErrorCode;
use sendfd::{RecvWithFd, SendWithFd};

use crate::driver::{
    init, mem_alloc_from_pool_async, mem_free_async, mem_pool_create_raw, mem_pool_destroy,
    mem_pool_export_pointer, mem_pool_export_to_fd, mem_pool_get_access, mem_pool_import_from_fd,
    mem_pool_import_pointer, mem_pool_set_access, memcpy_dtoh, memset_d8, memset_d8_async,
    stream_create, stream_destroy, stream_synchronize, RawPoolProps, HANDLE_TYPE_POSIX_FD,
    LOCATION_TYPE_DEVICE, LOCATION_TYPE_HOST_NUMA, STREAM_NON_BLOCKING,
};
use crate::support::{on_fresh_thread, primary_current, LIVENESS_BOUND, N};

/// Set in the child process of [`ipc_second_import_of_a_pointer_is_the_same_mapping`].
const CHILD: &str = "CUSTODY_CONFORMANCE_IPC_CHILD";
/// What the parent writes into its allocation and the child reads back through its import.
const FILL: u8 = 0xa5;
/// Bytes the child reads back.
const READ_BACK: usize = 4096;

/// A pool on device 0 exportable as a POSIX file descriptor.
#[track_caller]
fn ipc_pool() -> cuda_sys::types::CUmemoryPool {
    let mut props = RawPoolProps::new(LOCATION_TYPE_DEVICE, 0);
    props.handle_types = HANDLE_TYPE_POSIX_FD;
    let pool = mem_pool_create_raw(&props).check();
    assert!(!pool.is_null(), "cuMemPoolCreate returned NULL");
    pool
}

/// `cuMemPoolExportToShareableHandle`, the descriptor owned (closed on drop).
#[track_caller]
fn export_pool(pool: cuda_sys::types::CUmemoryPool) -> OwnedFd {
    let fd = mem_pool_export_to_fd(pool).check();
    assert!(
        fd >= 0,
        "cuMemPoolExportToShareableHandle gave descriptor {fd}"
    );
    // SAFETY: the driver just created this descriptor for the caller, who owns it; nothing
    // else in the process knows it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Measured (`docs/driver-facts.md` F21): a pinned pool on host NUMA node 0 exportable as a
/// POSIX file descriptor (what an IPC-enabled pinned memory resource makes) gives device 0 no
/// access (`CU_MEM_ACCESS_FLAGS_PROT_NONE`), so a memset of its memory on a stream of device 0
/// is `CUDA_ERROR_INVALID_VALUE`; after `cuMemPoolSetAccess(device 0, read-write)` it succeeds.
/// An importing process starts the same way (the Python suite's spawned child checks custody's
/// import grants access).
#[test]
fn ipc_host_numa_pool_gives_devices_no_access_until_granted() {
    on_fresh_thread("ipc-host-numa-access", || {
        init();
        let _primary = primary_current();
        let mut props = RawPoolProps::new(LOCATION_TYPE_HOST_NUMA, 0);
        props.handle_types = HANDLE_TYPE_POSIX_FD;
        props.max_size = 1 << 21;
        let pool = mem_pool_create_raw(&props).check();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        assert_eq!(
            mem_pool_get_access(pool, 0).check(),
            0,
            "no access at first"
        );
        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        memset_d8_async(p, 1, N, s).fails_with(CudaErrorCode::INVALID_VALUE);
        mem_pool_set_access(pool, 0, 3).check();
        assert_eq!(
            mem_pool_get_access(pool, 0).check(),
            3,
            "read-write once granted"
        );
        memset_d8_async(p, 2, N, s).check();
        stream_synchronize(s).check();
        // SAFETY: host pool memory is host-accessible at its address; the stream is idle.
        let first = unsafe { *(p as *const u8) };
        assert_eq!(first, 2, "the memset wrote the pool's host memory");
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

/// Measured: `CUDA_ERROR_INVALID_VALUE` from `cuMemPoolExportPointer` until the pool has been
/// exported once; success after.
#[test]
fn ipc_export_pointer_needs_the_pool_exported_once() {
    on_fresh_thread("ipc-export-pointer", || {
        init();
        let _primary = primary_current();
        let pool = ipc_pool();
        let s = stream_create(0).check();
        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        assert_ne!(p, 0);

        mem_pool_export_pointer(p).fails_with(CudaErrorCode::INVALID_VALUE);
        let fd = export_pool(pool);
        mem_pool_export_pointer(p).check();
        drop(fd);

        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

/// Measured: the second free fails; inferred: the addresses are equal. The child also reads
/// the parent's bytes through the import (documented: that is what an import is for). The
/// parent keeps its allocation until the child has exited, then frees it.
#[test]
fn ipc_second_import_of_a_pointer_is_the_same_mapping() {
    if std::env::var_os(CHILD).is_some() {
        return on_fresh_thread("ipc-importer", importer);
    }
    on_fresh_thread("ipc-exporter", || {
        init();
        let _primary = primary_current();
        let pool = ipc_pool();
        let fd = export_pool(pool);
        let s = stream_create(0).check();
        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        memset_d8(p, FILL, N).check();
        let data = mem_pool_export_pointer(p).check();

        let (socket, theirs) = UnixStream::pair().expect("a unix socket pair");
        // The Command is a temporary: its copy of the child's end closes before the reply is
        // read, so the read ends when the child does.
        let child = Command::new(std::env::current_exe().expect("the test binary's path"))
            .args([
                &case_name("ipc_second_import_of_a_pointer_is_the_same_mapping"),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the importing process");
        let sent = socket
            .send_with_fd(&data, &[fd.as_raw_fd()])
            .expect("send the pool descriptor and the export data");
        assert_eq!(sent, data.len());
        drop(fd); // the child has its own descriptor now

        let output = child.wait_with_output().expect("wait for the child");
        let mut reply = String::new();
        let read = socket
            .set_read_timeout(Some(LIVENESS_BOUND))
            .and_then(|()| (&socket).read_to_string(&mut reply));
        assert!(
            output.status.success() && read.is_ok() && reply == "ok",
            "the importing process failed ({}, replied {reply:?}, read {read:?}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );

        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

/// The child's side: imports the pointer twice from the imported pool, compares, frees twice.
fn importer() {
    let stdin = std::io::stdin().as_fd().try_clone_to_owned();
    let mut socket = UnixStream::from(stdin.expect("the socket on standard input"));
    let mut data = [0u8; 64];
    let mut fds = [-1; 1];
    let (n, nfds) = socket
        .recv_with_fd(&mut data, &mut fds)
        .expect("receive the pool descriptor");
    assert_eq!(nfds, 1, "no descriptor came with the export data");
    // SAFETY: `recv_with_fd` reported one descriptor received with SCM_RIGHTS; it is new in this
    // process and owned by nobody else.
    let pool_fd = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    socket
        .read_exact(&mut data[n..])
        .expect("the rest of the export data");

    init();
    let _primary = primary_current();
    let pool = mem_pool_import_from_fd(pool_fd.as_raw_fd()).check();
    assert!(!pool.is_null());
    drop(pool_fd);
    let s = stream_create(0).check();

    let first = mem_pool_import_pointer(pool, &data).check();
    let second = mem_pool_import_pointer(pool, &data).check();
    assert_ne!(first, 0);
    assert_eq!(
        first, second,
        "a second import of the same export data gives the same mapping"
    );
    let bytes = memcpy_dtoh(second, READ_BACK).check();
    assert!(
        bytes.iter().all(|&b| b == FILL),
        "the import maps the parent's bytes"
    );

    mem_free_async(first, s).check();
    stream_synchronize(s).check();
    // The first free unmapped the one mapping both imports returned.
    mem_free_async(second, s).fails_with(CudaErrorCode::INVALID_VALUE);
    stream_synchronize(s).check();

    stream_destroy(s).check();
    mem_pool_destroy(pool).check();
    socket.write_all(b"ok").expect("reply to the parent");
}

/// The libtest name of a case of this module (`ipc::<function>`), for `--exact`.
fn case_name(function: &str) -> String {
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_, module)| module);
    format!("{module}::{function}")
}
