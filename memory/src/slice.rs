//! Typed views of a [`Buffer`]: [`DeviceSlice`] (a shared borrow: copies out of it) and
//! [`DeviceSliceMut`] (an exclusive borrow of the buffer value, not of the memory: copies into
//! it, fills), over element ranges, made by
//! [`Buffer::as_slice`] and [`Buffer::as_slice_mut`]. Their copies and fills are the byte-range
//! operations of `copy.rs`.
//!
//! Element types are [`bytemuck::Pod`]: plain bytes with no padding and no invalid values, so a
//! copy between the device and a `&[T]` / `Vec<T>` is a copy of bytes and reading back what a
//! kernel wrote can never make an invalid value. Ranges, counts and offsets of the views are in
//! elements; every check happens before the first driver call, so a refused operation changes
//! nothing.

use std::fmt;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::ops::{Bound, RangeBounds};

use bytemuck::Pod;
use handles::sys_types::CUdeviceptr;
use handles::StreamHandle;

use crate::copy::{copy, fill, from_host, to_host, Bytes, FillValue};
use crate::{Buffer, MemoryError};

/// What both views hold: `len` elements over a byte range of a buffer (the element type is the
/// view's).
#[derive(Clone, Copy)]
struct Elements<'a> {
    bytes: Bytes<'a>,
    len: usize,
}

impl<'a> Elements<'a> {
    /// A whole buffer viewed as `T`s, after the layout checks.
    fn whole<T: Pod>(buffer: &'a Buffer) -> Result<Elements<'a>, MemoryError> {
        let element = size_of::<T>();
        if element == 0 {
            return Err(MemoryError::Layout {
                element_size: element,
                reason: "a zero-sized element type has no device representation",
            });
        }
        if !buffer.size().is_multiple_of(element) {
            return Err(MemoryError::Layout {
                element_size: element,
                reason: "the buffer's size is not a multiple of the element size",
            });
        }
        if !buffer.ptr().is_multiple_of(align_of::<T>() as u64) {
            return Err(MemoryError::Layout {
                element_size: element,
                reason: "the buffer's address is not aligned for the element type",
            });
        }
        Ok(Elements {
            bytes: buffer.whole(),
            len: buffer.size() / element,
        })
    }

    /// The elements `range` of these `T`s.
    ///
    /// # Errors
    /// [`MemoryError::OutOfRange`] for a range that is not within `0..len`.
    fn range<T>(self, range: impl RangeBounds<usize>) -> Result<Elements<'a>, MemoryError> {
        let (start, end) = element_range(range, self.len)?;
        Ok(self.sub::<T>(start, end))
    }

    /// The elements `start..end` of these `T`s (within `0..len`).
    fn sub<T>(self, start: usize, end: usize) -> Elements<'a> {
        Elements {
            bytes: Bytes {
                buffer: self.bytes.buffer,
                offset: self.bytes.offset + start * size_of::<T>(),
                len: (end - start) * size_of::<T>(),
            },
            len: end - start,
        }
    }
}

/// The element range `range` of `len` elements, as (start, end).
fn element_range(
    range: impl RangeBounds<usize>,
    len: usize,
) -> Result<(usize, usize), MemoryError> {
    let start = match range.start_bound() {
        Bound::Included(&n) => Some(n),
        Bound::Excluded(&n) => n.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&n) => n.checked_add(1),
        Bound::Excluded(&n) => Some(n),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(start), Some(end)) if start <= end && end <= len => Ok((start, end)),
        _ => Err(MemoryError::OutOfRange {
            start: start.unwrap_or(usize::MAX),
            end: end.unwrap_or(usize::MAX),
            len,
        }),
    }
}

/// A typed, shared view of `len()` elements of a [`Buffer`] (a sub-range or all of it): the
/// source of copies to the host ([`DeviceSlice::to_vec`], [`DeviceSlice::copy_to_host`]) and
/// of device-to-device copies ([`DeviceSliceMut::copy_from`]).
///
/// Made by [`Buffer::as_slice`] and [`DeviceSlice::slice`]; it borrows the buffer, so the buffer
/// cannot be closed while the view exists.
///
/// ```
/// # use std::sync::Arc;
/// # use handles::{ContextHandle, StreamFlags, StreamHandle};
/// # use memory::{DeviceMemoryResource, MemoryResource};
/// # let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mr = DeviceMemoryResource::new(0)?;
/// let mut buffer = mr.allocate(4 * 8, &stream)?;
/// buffer.as_slice_mut::<u32>()?.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8], &stream)?;
/// let view = buffer.as_slice::<u32>()?;
/// assert_eq!(view.len(), 8);
/// assert_eq!(view.slice(2..5)?.to_vec(&stream)?, [3, 4, 5]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DeviceSlice<'a, T> {
    elements: Elements<'a>,
    _elements: PhantomData<&'a [T]>,
}

/// A typed, exclusive view of `len()` elements of a [`Buffer`]: the destination of copies from
/// the host ([`DeviceSliceMut::copy_from_slice`]) and from other views
/// ([`DeviceSliceMut::copy_from`]), and of fills ([`DeviceSliceMut::fill`]).
///
/// Made by [`Buffer::as_slice_mut`], [`DeviceSliceMut::slice_mut`] and
/// [`DeviceSliceMut::split_at_mut`] (two disjoint views of one buffer, to copy between them).
///
/// **What "exclusive" covers.** The view borrows its [`Buffer`] mutably, so while it lives no
/// other view of that buffer value exists and nothing copies into, fills or closes it through
/// that value. It does not make the *memory* exclusive: another [`Buffer`] over the same
/// allocation ([`Buffer::from_parts`] of a clone of [`Buffer::handle`], an IPC import of the
/// same allocation), a graph that writes the memory when it runs, and work already queued on a
/// stream can write the same bytes meanwhile. That is memory-safe (device memory is never
/// handed out as a host reference, and every access is a bounds-checked driver copy or fill),
/// but it is not a data-race guarantee: what orders the writes is stream order (and
/// [`Buffer::record_use`] for the free), as for the untyped copies.
///
/// ```
/// # use handles::{ContextHandle, StreamFlags, StreamHandle};
/// # use memory::{DeviceMemoryResource, MemoryResource};
/// # let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mut buffer = DeviceMemoryResource::new(0)?.allocate(8 * 2, &stream)?;
/// let mut all = buffer.as_slice_mut::<u64>()?;
/// let (mut low, mut high) = all.split_at_mut(1)?;
/// low.copy_from_slice(&[42], &stream)?;
/// high.copy_from(&low.as_slice(), &stream)?;
/// assert_eq!(buffer.as_slice::<u64>()?.to_vec(&stream)?, [42, 42]);
///
/// // A second buffer over the same memory lends its own mutable view at the same time.
/// let mut alias = memory::Buffer::from_parts(buffer.handle().clone(), None);
/// let mut mine = buffer.as_slice_mut::<u64>()?;
/// alias.as_slice_mut::<u64>()?.copy_from_slice(&[7, 7], &stream)?;
/// mine.slice_mut(..1)?.copy_from_slice(&[8], &stream)?;
/// assert_eq!(alias.as_slice::<u64>()?.to_vec(&stream)?, [8, 7]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DeviceSliceMut<'a, T> {
    elements: Elements<'a>,
    _elements: PhantomData<&'a mut [T]>,
}

/// What both views have, written once: the constructor over [`Elements`], the element count, the
/// device address and `Debug`.
macro_rules! view_basics {
    ($view:ident) => {
        impl<'a, T: Pod> $view<'a, T> {
            fn over(elements: Elements<'a>) -> $view<'a, T> {
                $view {
                    elements,
                    _elements: PhantomData,
                }
            }

            /// The number of elements.
            pub fn len(&self) -> usize {
                self.elements.len
            }

            /// Whether the view has no elements.
            pub fn is_empty(&self) -> bool {
                self.elements.len == 0
            }

            /// The device address of the first element (for a kernel launch's argument).
            pub fn device_ptr(&self) -> CUdeviceptr {
                self.elements.bytes.ptr()
            }
        }

        impl<T> fmt::Debug for $view<'_, T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "{}<{}>(0x{:x}, {} elements)",
                    stringify!($view),
                    std::any::type_name::<T>(),
                    self.elements.bytes.ptr(),
                    self.elements.len
                )
            }
        }
    };
}

view_basics!(DeviceSlice);
view_basics!(DeviceSliceMut);

impl<'a, T: Pod> DeviceSlice<'a, T> {
    pub(crate) fn whole(buffer: &'a Buffer) -> Result<DeviceSlice<'a, T>, MemoryError> {
        Ok(DeviceSlice::over(Elements::whole::<T>(buffer)?))
    }

    /// The buffer the view borrows.
    pub fn buffer(&self) -> &'a Buffer {
        self.elements.bytes.buffer
    }

    /// The elements `range` of this view.
    ///
    /// # Errors
    /// [`MemoryError::OutOfRange`] for a range that is not within `0..len()`.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'a, T>, MemoryError> {
        Ok(DeviceSlice::over(self.elements.range::<T>(range)?))
    }

    /// Copies the view into `dst` on the host, ordered on `stream` after the work queued
    /// there, and **blocks** until the elements have arrived.
    ///
    /// # Errors
    /// [`MemoryError::SizeMismatch`] (in bytes) unless `dst.len()` is `self.len()`;
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for device memory and a stream of another device;
    /// [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemcpyAsync`,
    /// `cuStreamSynchronize`; none for an empty view (`Ok` at once).
    pub fn copy_to_host(&self, dst: &mut [T], stream: &StreamHandle) -> Result<(), MemoryError> {
        to_host(self.elements.bytes, bytemuck::cast_slice_mut(dst), stream)
    }

    /// The view's elements, copied to the host: [`DeviceSlice::copy_to_host`] into a new
    /// vector. **Blocks.**
    ///
    /// # Errors
    /// As [`DeviceSlice::copy_to_host`].
    ///
    /// Driver calls: as [`DeviceSlice::copy_to_host`].
    pub fn to_vec(&self, stream: &StreamHandle) -> Result<Vec<T>, MemoryError> {
        let mut out = vec![T::zeroed(); self.elements.len];
        self.copy_to_host(&mut out, stream)?;
        Ok(out)
    }
}

impl<'a, T: Pod> DeviceSliceMut<'a, T> {
    pub(crate) fn whole(buffer: &'a mut Buffer) -> Result<DeviceSliceMut<'a, T>, MemoryError> {
        Ok(DeviceSliceMut::over(Elements::whole::<T>(buffer)?))
    }

    /// The same elements as a shared view (the source of a copy).
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice::over(self.elements)
    }

    /// The elements `range` of this view, borrowed exclusively.
    ///
    /// # Errors
    /// [`MemoryError::OutOfRange`] for a range that is not within `0..len()`.
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceSliceMut<'_, T>, MemoryError> {
        Ok(DeviceSliceMut::over(self.elements.range::<T>(range)?))
    }

    /// Two disjoint views, of the elements before `mid` and from `mid` on.
    ///
    /// # Errors
    /// [`MemoryError::OutOfRange`] when `mid > len()`.
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>), MemoryError> {
        let (len, elements) = (self.elements.len, self.elements);
        let (_, mid) = element_range(..mid, len)?;
        Ok((
            DeviceSliceMut::over(elements.sub::<T>(0, mid)),
            DeviceSliceMut::over(elements.sub::<T>(mid, len)),
        ))
    }

    /// Copies `src` from the host into the view, ordered on `stream` after the work queued
    /// there, and **blocks** until the copy has finished (so `src` may be changed after).
    ///
    /// # Errors
    /// [`MemoryError::SizeMismatch`] (in bytes) unless `src.len()` is `self.len()`; as
    /// [`DeviceSlice::copy_to_host`] otherwise.
    ///
    /// Driver calls: as [`DeviceSlice::copy_to_host`].
    pub fn copy_from_slice(&mut self, src: &[T], stream: &StreamHandle) -> Result<(), MemoryError> {
        from_host(self.elements.bytes, bytemuck::cast_slice(src), stream)
    }

    /// Copies the view `src` (of this buffer or another) into this one, ordered on `stream`.
    /// Does not block.
    ///
    /// # Errors
    /// [`MemoryError::SizeMismatch`] (in bytes) for views of different lengths;
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) when both are device memory and the stream is on neither's
    /// device; [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemcpyAsync`; none for
    /// an empty view (`Ok`).
    pub fn copy_from(
        &mut self,
        src: &DeviceSlice<'_, T>,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        copy(self.elements.bytes, src.elements.bytes, stream)
    }

    /// Sets every element to `value`, ordered on `stream`. Does not block. `T` must be 1, 2 or
    /// 4 bytes wide (the driver's memsets).
    ///
    /// # Errors
    /// [`MemoryError::InvalidFill`] for an element of another width; as
    /// [`crate::Buffer::fill`] otherwise.
    ///
    /// Driver calls: as [`crate::Buffer::fill`].
    pub fn fill(&mut self, value: T, stream: &StreamHandle) -> Result<(), MemoryError> {
        let value = FillValue::from_bytes(bytemuck::bytes_of(&value))?;
        fill(self.elements.bytes, value, stream)
    }
}

impl Buffer {
    /// The buffer as a typed view of `T`s over all of it (a shared borrow: copies out of it).
    ///
    /// # Errors
    /// [`MemoryError::Layout`]: the size is not a multiple of `size_of::<T>()`, or the address
    /// is not aligned to `align_of::<T>()` (or `T` is zero-sized).
    pub fn as_slice<T: Pod>(&self) -> Result<DeviceSlice<'_, T>, MemoryError> {
        DeviceSlice::whole(self)
    }

    /// The buffer as a typed view of `T`s over all of it, borrowed exclusively (copies into
    /// it, fills).
    ///
    /// # Errors
    /// As [`Buffer::as_slice`].
    pub fn as_slice_mut<T: Pod>(&mut self) -> Result<DeviceSliceMut<'_, T>, MemoryError> {
        DeviceSliceMut::whole(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_ranges_are_checked() {
        assert_eq!(element_range(.., 4), Ok((0, 4)));
        assert_eq!(element_range(1..=2, 4), Ok((1, 3)));
        assert_eq!(element_range(4.., 4), Ok((4, 4)));
        #[allow(clippy::reversed_empty_ranges)]
        for bad in [
            element_range(3..2, 4),
            element_range(0..5, 4),
            element_range(..=usize::MAX, 4),
        ] {
            assert!(
                matches!(bad, Err(MemoryError::OutOfRange { len: 4, .. })),
                "{bad:?}"
            );
        }
    }
}
