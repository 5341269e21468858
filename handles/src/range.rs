//! [`DeviceRange`]: a checked byte range of a [`DevicePtrHandle`], and the copies and fills that
//! take one (the only way safe code reads or writes memory through custody).

use std::fmt;

use cuda_sys::types::{CUdeviceptr, CUstream};
use cuda_sys::Driver;

use crate::deviceptr::DevicePtrHandle;
use crate::error::HandleError;
use crate::stream::StreamHandle;

/// `len` bytes at `offset` into the memory of a [`DevicePtrHandle`], checked to lie inside it
/// when made ([`DevicePtrHandle::range`], [`DevicePtrHandle::as_range`]).
///
/// A range borrows its handle, so the memory cannot be released (nor the handle's last
/// reference dropped) while the range exists; it is `Copy`, and passing one to a copy or fill
/// is the only way safe code reaches memory through custody. Which memory the handle names was
/// vouched for once, where the handle was made: by the driver (an allocation), or by the
/// caller of an `unsafe` constructor in [`crate::raw`].
///
/// A copy or fill of zero bytes is checked as any other (lengths, alignment) and then does
/// nothing: it makes no driver call, waits for nothing and returns `Ok` (nothing is queued, so
/// stream order is kept trivially). What a driver does with a zero-length `cuMemsetD8Async` or
/// `cuMemcpyAsync` is not relied on.
///
/// Copies and fills are *ordered on a stream* and most do not block: the memory must stay
/// allocated until the work has run. Keeping the handle (a clone of it) until then, or recording
/// the free on that stream ([`DevicePtrHandle::set_deallocation_stream`]), orders the free
/// after it; ordering work on other streams before the free is the caller's job.
#[derive(Clone, Copy)]
pub struct DeviceRange<'a> {
    handle: &'a DevicePtrHandle,
    offset: usize,
    len: usize,
}

impl DevicePtrHandle {
    /// The `len` bytes at `offset` into this memory.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] when `offset + len` overflows or passes the end of the
    /// memory ([`DevicePtrHandle::size`] bytes). No driver call.
    #[inline]
    pub fn range(&self, offset: usize, len: usize) -> Result<DeviceRange<'_>, HandleError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(DeviceRange {
                handle: self,
                offset,
                len,
            }),
            _ => Err(out_of_bounds(offset, len, self.size())),
        }
    }

    /// The whole memory as one range (`0..size`). No driver call.
    #[inline]
    pub fn as_range(&self) -> DeviceRange<'_> {
        DeviceRange {
            handle: self,
            offset: 0,
            len: self.size(),
        }
    }
}

#[cold]
fn out_of_bounds(offset: usize, len: usize, size: usize) -> HandleError {
    HandleError::invalid(
        "range",
        format!("{len} bytes at offset {offset} do not fit in {size} bytes of memory"),
    )
}

impl<'a> DeviceRange<'a> {
    /// The handle whose memory this is.
    #[inline]
    pub fn handle(&self) -> &'a DevicePtrHandle {
        self.handle
    }

    /// The first byte's address (device address, or host address for pinned host memory).
    #[inline]
    pub fn ptr(&self) -> CUdeviceptr {
        self.handle.ptr() + self.offset as u64
    }

    /// The offset in bytes from the start of the handle's memory.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range holds no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `offset` into this range.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] when they do not lie inside this range. No driver call.
    pub fn subrange(&self, offset: usize, len: usize) -> Result<DeviceRange<'a>, HandleError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceRange {
                handle: self.handle,
                offset: self.offset + offset,
                len,
            }),
            _ => Err(out_of_bounds(offset, len, self.len)),
        }
    }

    /// Copies this range into `dst`, ordered on `stream`. Does not block. Either side may be
    /// device, pinned host or managed memory (unified addressing tells the driver which);
    /// overlapping ranges leave the destination's bytes unspecified.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] when the lengths differ (no driver call);
    /// [`HandleError::NoCurrentContext`] for an unbound default-stream token on a thread with no
    /// context; [`HandleError::Driver`] when the driver rejects the copy. Zero bytes: `Ok`
    /// with no driver call.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (when the stream's context is not
    /// current), `cuMemcpyAsync`; none for zero bytes.
    pub fn copy_to(&self, dst: &DeviceRange<'_>, stream: &StreamHandle) -> Result<(), HandleError> {
        if dst.len != self.len {
            return Err(HandleError::invalid(
                "dst",
                format!(
                    "the source holds {} bytes and the destination {}",
                    self.len, dst.len
                ),
            ));
        }
        if self.len == 0 {
            return Ok(());
        }
        let (dst_ptr, src_ptr, len) = (dst.ptr(), self.ptr(), self.len);
        stream.run("cuMemcpyAsync", |d: &'static Driver, s: CUstream| {
            // SAFETY: both ranges lie inside memory their handles name, and the borrows keep
            // the handles (so the memory) alive for the call; the stream handle is alive and its
            // context is current.
            unsafe { (d.cuMemcpyAsync)(dst_ptr, src_ptr, len, s) }
        })
    }

    /// Copies this range into `dst` on the host, ordered on `stream` after the work queued
    /// there, and **blocks** until the bytes have arrived.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] unless `dst.len()` is the range's length (no driver
    /// call); as [`DeviceRange::copy_to`], and the stream's failure (`cuStreamSynchronize`).
    /// Zero bytes: `Ok` at once, with no driver call (so no wait for the stream either).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemcpyAsync`,
    /// `cuStreamSynchronize`; none for zero bytes.
    pub fn copy_to_host(&self, dst: &mut [u8], stream: &StreamHandle) -> Result<(), HandleError> {
        self.copy_with_host(Host::Into(dst), stream)
    }

    /// Copies `src` from the host into this range, ordered on `stream` after the work queued
    /// there, and **blocks** until the copy has finished (so `src` may be reused at once).
    ///
    /// # Errors
    /// As [`DeviceRange::copy_to_host`].
    ///
    /// Driver calls: as [`DeviceRange::copy_to_host`].
    pub fn copy_from_host(&self, src: &[u8], stream: &StreamHandle) -> Result<(), HandleError> {
        self.copy_with_host(Host::From(src), stream)
    }

    /// The body of [`DeviceRange::copy_to_host`] and [`DeviceRange::copy_from_host`]: a copy
    /// between the range and `host`, ordered on `stream`, that blocks until it has finished.
    fn copy_with_host(&self, host: Host<'_>, stream: &StreamHandle) -> Result<(), HandleError> {
        let (dst, src, host_len) = match host {
            Host::Into(dst) => (dst.as_mut_ptr() as CUdeviceptr, self.ptr(), dst.len()),
            Host::From(src) => (self.ptr(), src.as_ptr() as CUdeviceptr, src.len()),
        };
        self.check_host_len(host_len)?;
        if self.len == 0 {
            return Ok(());
        }
        let len = self.len;
        stream.run_then_synchronize("cuMemcpyAsync", |d, s| {
            // SAFETY: the host slice holds `len` bytes (checked), is writable when written, and
            // is borrowed for this call, which returns only after the stream (and so the copy)
            // has finished; the range lies inside memory its borrowed handle keeps alive.
            unsafe { (d.cuMemcpyAsync)(dst, src, len, s) }
        })
    }

    /// Sets every byte of the range to `value`, ordered on `stream`. Does not block.
    ///
    /// # Errors
    /// As [`DeviceRange::copy_to`] (without the length check); zero bytes: `Ok` with no
    /// driver call.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemsetD8Async`; none
    /// for zero bytes.
    pub fn fill_u8(&self, value: u8, stream: &StreamHandle) -> Result<(), HandleError> {
        self.fill("cuMemsetD8Async", |d| d.cuMemsetD8Async, value, stream)
    }

    /// Sets the range, as `len / 2` 16-bit elements, to `value`, ordered on `stream`. Does not
    /// block.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] when the length or the address is not a multiple of 2
    /// (no driver call); otherwise as [`DeviceRange::fill_u8`] (zero bytes: `Ok`, no driver
    /// call).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemsetD16Async`;
    /// none for zero bytes.
    pub fn fill_u16(&self, value: u16, stream: &StreamHandle) -> Result<(), HandleError> {
        self.fill("cuMemsetD16Async", |d| d.cuMemsetD16Async, value, stream)
    }

    /// Sets the range, as `len / 4` 32-bit elements, to `value`, ordered on `stream`. Does not
    /// block.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] when the length or the address is not a multiple of 4
    /// (no driver call); otherwise as [`DeviceRange::fill_u8`] (zero bytes: `Ok`, no driver
    /// call).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemsetD32Async`;
    /// none for zero bytes.
    pub fn fill_u32(&self, value: u32, stream: &StreamHandle) -> Result<(), HandleError> {
        self.fill("cuMemsetD32Async", |d| d.cuMemsetD32Async, value, stream)
    }

    /// The body of the fills: sets the range, as elements of `T` (1, 2 or 4 bytes), to
    /// `value` with `memset` (the driver's `call`), ordered on `stream`; zero bytes make no
    /// driver call.
    fn fill<T: Copy>(
        &self,
        call: &'static str,
        memset: fn(&Driver) -> MemsetCall<T>,
        value: T,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        let count = self.elements(std::mem::size_of::<T>())?;
        if count == 0 {
            return Ok(());
        }
        let dst = self.ptr();
        stream.run(call, |d, s| {
            // SAFETY: `count` elements of `T` fill exactly the range, which lies inside memory
            // its borrowed handle keeps alive; the stream is alive and its context current.
            unsafe { memset(d)(dst, value, count, s) }
        })
    }

    /// How many `width`-byte elements make up the range, checking length and alignment.
    fn elements(&self, width: usize) -> Result<usize, HandleError> {
        if !self.len.is_multiple_of(width) {
            return Err(HandleError::invalid(
                "range",
                format!(
                    "{} bytes are not a whole number of {width}-byte elements",
                    self.len
                ),
            ));
        }
        if !self.ptr().is_multiple_of(width as u64) {
            return Err(HandleError::invalid(
                "range",
                format!("the address is not aligned to {width} bytes"),
            ));
        }
        Ok(self.len / width)
    }

    fn check_host_len(&self, host: usize) -> Result<(), HandleError> {
        if host != self.len {
            return Err(HandleError::invalid(
                "host slice",
                format!("it holds {host} bytes and the range {}", self.len),
            ));
        }
        Ok(())
    }
}

/// The host side of a blocking copy: the slice written (`Into`) or read (`From`).
enum Host<'a> {
    Into(&'a mut [u8]),
    From(&'a [u8]),
}

/// The driver's signature of `cuMemsetD8Async`, `cuMemsetD16Async` and `cuMemsetD32Async`, for
/// elements of `T`.
type MemsetCall<T> = unsafe extern "C" fn(CUdeviceptr, T, usize, CUstream) -> cuda_sys::CUresult;

impl fmt::Debug for DeviceRange<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceRange(0x{:x}, {} bytes at offset {})",
            self.ptr(),
            self.len,
            self.offset
        )
    }
}
