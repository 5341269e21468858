//! Copies and fills: [`FillValue`], the byte-range operations every copy and fill runs through
//! (a buffer's own and its typed views'), and a [`Buffer`]'s copies, fills and host transfers.
//! Every check happens before the first driver call, so a refused operation changes nothing.
//! Zero bytes pass the size and alignment checks as any length does and then return `Ok`
//! with no driver call at all (no device check, no copy, fill or wait): nothing is queued, so
//! stream order holds trivially, and no driver's answer to a zero-length call is relied on.

use handles::sys_types::CUdeviceptr;
use handles::{DeviceRange, StreamHandle};

use crate::checks::{check_stream_device, stream_device};
use crate::{Buffer, MemoryError};

/// A byte range of a buffer: what every copy and fill works on.
#[derive(Clone, Copy)]
pub(crate) struct Bytes<'a> {
    pub(crate) buffer: &'a Buffer,
    /// From the start of the buffer, in bytes.
    pub(crate) offset: usize,
    /// In bytes.
    pub(crate) len: usize,
}

impl<'a> Bytes<'a> {
    /// The device address of the first byte.
    #[inline]
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.buffer.ptr() + self.offset as u64
    }

    /// The handles crate's checked range for these bytes (the only way to copy or fill).
    #[inline]
    fn range(&self) -> Result<DeviceRange<'a>, MemoryError> {
        Ok(self.buffer.handle().range(self.offset, self.len)?)
    }
}

/// Copies `src` into `dst` (equal lengths), ordered on `stream`. Does not block.
pub(crate) fn copy(
    dst: Bytes<'_>,
    src: Bytes<'_>,
    stream: &StreamHandle,
) -> Result<(), MemoryError> {
    if src.len != dst.len {
        return Err(MemoryError::SizeMismatch {
            src: src.len,
            dst: dst.len,
        });
    }
    if src.len == 0 {
        return Ok(());
    }
    let devices = [src.buffer.ops_device()?, dst.buffer.ops_device()?];
    if let [Some(first), second] | [second, Some(first)] = devices {
        let found = stream_device(stream)?;
        if found != first && second != Some(found) {
            return Err(MemoryError::wrong_device(first, found));
        }
    }
    src.range()?.copy_to(&dst.range()?, stream)?;
    Ok(())
}

/// Fills `dst` with `value`, ordered on `stream`. Does not block.
pub(crate) fn fill(
    dst: Bytes<'_>,
    value: FillValue,
    stream: &StreamHandle,
) -> Result<(), MemoryError> {
    value.check_fits(dst.len, dst.ptr())?;
    if dst.len == 0 {
        return Ok(());
    }
    if let Some(device) = dst.buffer.ops_device()? {
        check_stream_device(stream, device)?;
    }
    let range = dst.range()?;
    match value {
        FillValue::U8(v) => range.fill_u8(v, stream)?,
        FillValue::U16(v) => range.fill_u16(v, stream)?,
        FillValue::U32(v) => range.fill_u32(v, stream)?,
    }
    Ok(())
}

/// Copies `src` into host memory `dst` (equal lengths) and blocks until it has arrived.
pub(crate) fn to_host(
    src: Bytes<'_>,
    dst: &mut [u8],
    stream: &StreamHandle,
) -> Result<(), MemoryError> {
    host_checks(src, dst.len(), stream, true)?;
    Ok(src.range()?.copy_to_host(dst, stream)?)
}

/// Copies host memory `src` into `dst` (equal lengths) and blocks until it has been read.
pub(crate) fn from_host(
    dst: Bytes<'_>,
    src: &[u8],
    stream: &StreamHandle,
) -> Result<(), MemoryError> {
    host_checks(dst, src.len(), stream, false)?;
    Ok(dst.range()?.copy_from_host(src, stream)?)
}

fn host_checks(
    device: Bytes<'_>,
    host_len: usize,
    stream: &StreamHandle,
    to_host: bool,
) -> Result<(), MemoryError> {
    if host_len != device.len {
        let (src, dst) = if to_host {
            (device.len, host_len)
        } else {
            (host_len, device.len)
        };
        return Err(MemoryError::SizeMismatch { src, dst });
    }
    if device.len == 0 {
        // Zero bytes: the handles crate's range makes no driver call either.
        return Ok(());
    }
    if let Some(ordinal) = device.buffer.ops_device()? {
        check_stream_device(stream, ordinal)?;
    }
    Ok(())
}

impl Buffer {
    /// All of this buffer, as a byte range for the operations the typed views share.
    #[inline]
    pub(crate) fn whole(&self) -> Bytes<'_> {
        Bytes {
            buffer: self,
            offset: 0,
            len: self.size(),
        }
    }

    /// Copies this buffer into `dst`, ordered on `stream`. Does not block. Both buffers must
    /// stay open (or their frees be ordered after `stream`) until the copy has run.
    ///
    /// # Errors
    /// - [`MemoryError::SizeMismatch`]: the sizes differ.
    /// - [`HandleError::WrongDevice`](handles::HandleError::WrongDevice): both buffers are device memory and the stream is on
    ///   neither's device.
    /// - [`MemoryError::Handle`]: the driver's failure; no current context for a token.
    ///
    /// Zero bytes (two empty buffers): `Ok`, with no driver call and no device check.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemcpyAsync`; none
    /// for zero bytes.
    pub fn copy_to(&self, dst: &Buffer, stream: &StreamHandle) -> Result<(), MemoryError> {
        copy(dst.whole(), self.whole(), stream)
    }

    /// Copies `src` into this buffer, ordered on `stream`: `src.copy_to(self, stream)`.
    ///
    /// # Errors
    /// As [`Buffer::copy_to`].
    ///
    /// Driver calls: as [`Buffer::copy_to`].
    pub fn copy_from(&self, src: &Buffer, stream: &StreamHandle) -> Result<(), MemoryError> {
        src.copy_to(self, stream)
    }

    /// Allocates a buffer of the same size from this buffer's memory resource, ordered on
    /// `stream` (which becomes its deallocation stream), and copies this buffer into it.
    ///
    /// # Errors
    /// [`MemoryError::NoMemoryResource`] for a view; the allocation's errors; as
    /// [`Buffer::copy_to`] (the new buffer is then dropped, freed on `stream`).
    ///
    /// Driver calls: the resource's allocation, then as [`Buffer::copy_to`].
    pub fn copy_to_new(&self, stream: &StreamHandle) -> Result<Buffer, MemoryError> {
        let mr = self
            .memory_resource()
            .cloned()
            .ok_or(MemoryError::NoMemoryResource)?;
        let new = mr.allocate_owned(self.size(), stream)?;
        self.copy_to(&new, stream)?;
        Ok(new)
    }

    /// Fills the buffer with `value` (an 8-, 16- or 32-bit pattern, repeated), ordered on
    /// `stream`. Does not block.
    ///
    /// # Errors
    /// - [`MemoryError::InvalidFill`]: the size or the address is not a multiple of the
    ///   pattern's width.
    /// - [`HandleError::WrongDevice`](handles::HandleError::WrongDevice): device memory and a stream of another device.
    /// - [`MemoryError::Handle`]: the driver's failure; no current context for a token.
    ///
    /// An empty buffer: `Ok` after the width and alignment checks, with no driver call.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), one of
    /// `cuMemsetD8Async`, `cuMemsetD16Async`, `cuMemsetD32Async`; none for zero bytes.
    pub fn fill(
        &self,
        value: impl Into<FillValue>,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        fill(self.whole(), value.into(), stream)
    }

    /// Copies the whole buffer into `dst` on the host, ordered on `stream` after the work
    /// queued there, and **blocks** until the bytes have arrived.
    ///
    /// # Errors
    /// [`MemoryError::SizeMismatch`] unless `dst.len()` is the buffer's size;
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) as [`Buffer::fill`]; [`MemoryError::Handle`] for the
    /// driver's failure. Zero bytes: `Ok` at once, with no driver call (no wait for the
    /// stream either).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemcpyAsync`,
    /// `cuStreamSynchronize`; none for zero bytes.
    pub fn copy_to_host(&self, dst: &mut [u8], stream: &StreamHandle) -> Result<(), MemoryError> {
        to_host(self.whole(), dst, stream)
    }

    /// Copies `src` from the host into the whole buffer, ordered on `stream` after the work
    /// queued there, and **blocks** until the copy has finished.
    ///
    /// # Errors
    /// As [`Buffer::copy_to_host`].
    ///
    /// Driver calls: as [`Buffer::copy_to_host`].
    pub fn copy_from_host(&self, src: &[u8], stream: &StreamHandle) -> Result<(), MemoryError> {
        from_host(self.whole(), src, stream)
    }
}

/// A fill pattern: one value of 8, 16 or 32 bits, repeated over the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillValue {
    /// An 8-bit pattern (`cuMemsetD8Async`).
    U8(u8),
    /// A 16-bit pattern (`cuMemsetD16Async`); the buffer's size must be a multiple of 2.
    U16(u16),
    /// A 32-bit pattern (`cuMemsetD32Async`); the buffer's size must be a multiple of 4.
    U32(u32),
}

impl FillValue {
    /// The checks a fill (of a buffer, a view or a graph's memset node) makes on the pattern,
    /// before anything is recorded: `size` bytes at `ptr` must be whole patterns, aligned.
    ///
    /// # Errors
    /// [`MemoryError::InvalidFill`].
    pub(crate) fn check_fits(self, size: usize, ptr: CUdeviceptr) -> Result<(), MemoryError> {
        let width = self.width();
        if !size.is_multiple_of(width) {
            return Err(MemoryError::InvalidFill {
                width,
                reason: "the buffer's size is not a multiple of the pattern's width",
            });
        }
        if !ptr.is_multiple_of(width as u64) {
            return Err(MemoryError::InvalidFill {
                width,
                reason: "the buffer's address is not aligned to the pattern's width",
            });
        }
        Ok(())
    }

    /// The pattern's width in bytes.
    pub fn width(self) -> usize {
        match self {
            FillValue::U8(_) => 1,
            FillValue::U16(_) => 2,
            FillValue::U32(_) => 4,
        }
    }

    /// The pattern whose memory representation is `bytes` (1, 2 or 4 of them, in memory
    /// order), for values given as raw bytes (Python's buffer protocol).
    ///
    /// # Errors
    /// [`MemoryError::InvalidFill`] for any other width.
    pub fn from_bytes(bytes: &[u8]) -> Result<FillValue, MemoryError> {
        match *bytes {
            [a] => Ok(FillValue::U8(a)),
            [a, b] => Ok(FillValue::U16(u16::from_ne_bytes([a, b]))),
            [a, b, c, d] => Ok(FillValue::U32(u32::from_ne_bytes([a, b, c, d]))),
            _ => Err(MemoryError::InvalidFill {
                width: bytes.len(),
                reason: "a pattern is 1, 2 or 4 bytes wide",
            }),
        }
    }
}

impl From<u8> for FillValue {
    fn from(value: u8) -> FillValue {
        FillValue::U8(value)
    }
}

impl From<u16> for FillValue {
    fn from(value: u16) -> FillValue {
        FillValue::U16(value)
    }
}

impl From<u32> for FillValue {
    fn from(value: u32) -> FillValue {
        FillValue::U32(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_values_from_bytes_keep_memory_order() {
        assert_eq!(FillValue::from_bytes(&[7]), Ok(FillValue::U8(7)));
        let two = FillValue::from_bytes(&[1, 2]).unwrap();
        assert_eq!(two, FillValue::U16(u16::from_ne_bytes([1, 2])));
        assert_eq!(two.width(), 2);
        let four = FillValue::from_bytes(&[1, 2, 3, 4]).unwrap();
        assert_eq!(four, FillValue::U32(u32::from_ne_bytes([1, 2, 3, 4])));
        for bad in [&[][..], &[1, 2, 3], &[0; 8]] {
            assert!(matches!(
                FillValue::from_bytes(bad),
                Err(MemoryError::InvalidFill { width, .. }) if width == bad.len()
            ));
        }
    }
}
