//! The few C library calls the emulator needs beyond `std`: an address-space reservation for
//! device pointers and shared mappings of `memfd` files for pool IPC.
//!
//! They are declared here rather than taken from the `libc` crate because `std` already links
//! the C library and these three signatures are stable on every 64-bit Linux.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

extern "C" {
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: i64,
    ) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
}

const PROT_NONE: c_int = 0;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_SHARED: c_int = 0x01;
const MAP_PRIVATE: c_int = 0x02;
const MAP_ANONYMOUS: c_int = 0x20;
const MAP_NORESERVE: c_int = 0x4000;
const MFD_CLOEXEC: c_uint = 1;

/// Size of the device address range: 1 TiB of address space, never backed.
pub(crate) const DEVICE_VA_SIZE: u64 = 1 << 40;
/// Used when the reservation fails (for example under a small `RLIMIT_AS`): above the 47-bit
/// user address space, so it can never be a host pointer either.
const FALLBACK_DEVICE_VA: u64 = 1 << 48;

/// Reserves an inaccessible range of the process's address space for device pointers, so that a
/// device pointer is never a host address (and dereferencing one on the host faults, as with
/// real device memory). Returns its base.
pub(crate) fn reserve_device_va() -> u64 {
    // SAFETY: an anonymous PROT_NONE reservation with no fixed address cannot alias any
    // existing mapping; the result is checked against MAP_FAILED.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            DEVICE_VA_SIZE as usize,
            PROT_NONE,
            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p as isize == -1 || p.is_null() {
        FALLBACK_DEVICE_VA
    } else {
        p as u64
    }
}

/// A shared, read-write mapping of a whole file (a memfd), unmapped on drop.
pub(crate) struct SharedMap {
    ptr: *mut u8,
    len: usize,
    file: File,
}

// SAFETY: the mapping is plain memory valid for the life of the value; concurrent access to the
// bytes is the program's business exactly as with device memory.
unsafe impl Send for SharedMap {}
// SAFETY: as for Send; the struct itself has no interior mutability.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Creates an anonymous memfd of `len` bytes and maps it.
    pub(crate) fn create(name: &str, len: usize) -> std::io::Result<SharedMap> {
        let cname = std::ffi::CString::new(name).unwrap_or_default();
        // SAFETY: `cname` is NUL-terminated; the returned fd is checked.
        let fd = unsafe { memfd_create(cname.as_ptr(), MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64)?;
        SharedMap::map(file)
    }

    /// Maps the whole of `file` shared and read-write.
    pub(crate) fn map(file: File) -> std::io::Result<SharedMap> {
        let len = file.metadata()?.len() as usize;
        if len == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        // SAFETY: maps an open file descriptor with no fixed address; checked for MAP_FAILED.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                PROT_READ | PROT_WRITE,
                MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p as isize == -1 || p.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: p.cast(),
            len,
            file,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `map`, unmapped once.
        unsafe {
            munmap(self.ptr.cast(), self.len);
        }
    }
}
