//! Where a buffer's managed memory lives: advice ([`Buffer::advise`] and the range attributes
//! that report it), prefetch and discard, one buffer at a time or in batches
//! ([`prefetch_batch`], [`discard_batch`], [`discard_prefetch_batch`]).
//!
//! Every operation first checks that the memory is managed: by its memory resource, else by
//! asking the driver (`CU_POINTER_ATTRIBUTE_IS_MANAGED`), so a [`crate::ManagedBuffer`] made over
//! memory that is not managed is refused with [`MemoryError::NotManaged`] before the operation's
//! driver call. A buffer of zero bytes then gets no placement call at all (advice, prefetch
//! and discard return `Ok`; a batch leaves it out, and a batch of only empty buffers makes no
//! call): the handles crate's ranges skip zero-length calls.

use handles::{DeviceRange, MemAdvice, MemLocation, StreamHandle};

use crate::{Buffer, MemoryError};

impl Buffer {
    /// The whole buffer as a range, once its memory is known to be managed.
    fn managed_range(&self, operation: &'static str) -> Result<DeviceRange<'_>, MemoryError> {
        let by_resource = self.memory_resource().is_some_and(|mr| mr.is_managed());
        if !by_resource && !handles::pointer_attributes(self.ptr())?.is_some_and(|a| a.is_managed) {
            return Err(MemoryError::NotManaged { operation });
        }
        Ok(self.handle().as_range())
    }

    /// Gives the driver `advice` for the buffer's managed memory. Not ordered on any stream;
    /// does not block.
    ///
    /// # Errors
    /// [`MemoryError::NotManaged`] for memory that is not managed; [`MemoryError::Handle`] for
    /// the driver's refusal (a location the advice does not take) or a driver before CUDA 12.2.
    ///
    /// Driver calls: `cuPointerGetAttributes` (unless the resource says managed),
    /// `cuMemAdvise_v2`.
    pub fn advise(&self, advice: MemAdvice) -> Result<(), MemoryError> {
        Ok(self.managed_range("advise")?.advise(advice)?)
    }

    /// Migrates the buffer's managed memory to `location`, ordered on `stream`. Does not block.
    ///
    /// # Errors
    /// As [`Buffer::advise`].
    ///
    /// Driver calls: `cuPointerGetAttributes` (unless the resource says managed),
    /// `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemPrefetchAsync_v2`.
    pub fn prefetch(
        &self,
        location: MemLocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        Ok(self.managed_range("prefetch")?.prefetch(location, stream)?)
    }

    /// Discards the buffer's contents (they read as undefined until written), ordered on
    /// `stream`. Does not block.
    ///
    /// # Errors
    /// As [`Buffer::advise`] (a driver before CUDA 12.8).
    ///
    /// Driver calls: as [`discard_batch`].
    pub fn discard(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        discard_batch(&[self], stream)
    }

    /// Discards the buffer's contents and migrates it to `location`, ordered on `stream`. Does
    /// not block.
    ///
    /// # Errors
    /// As [`Buffer::discard`].
    ///
    /// Driver calls: as [`discard_prefetch_batch`].
    pub fn discard_prefetch(
        &self,
        location: MemLocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        discard_prefetch_batch(&[self], &[location], stream)
    }

    /// Whether read-mostly advice is set for the buffer.
    ///
    /// # Errors
    /// As [`Buffer::advise`].
    ///
    /// Driver calls: `cuPointerGetAttributes` (unless the resource says managed),
    /// `cuMemRangeGetAttribute`.
    pub fn read_mostly(&self) -> Result<bool, MemoryError> {
        Ok(self.managed_range("read_mostly")?.read_mostly()?)
    }

    /// The preferred location advised for the buffer, `None` when none is.
    ///
    /// # Errors
    /// As [`Buffer::advise`].
    ///
    /// Driver calls: `cuPointerGetAttributes` (unless the resource says managed),
    /// `cuMemRangeGetAttribute` (twice from CUDA 12.2 on).
    pub fn preferred_location(&self) -> Result<Option<MemLocation>, MemoryError> {
        Ok(self
            .managed_range("preferred_location")?
            .preferred_location()?)
    }

    /// The devices (and the host) accessed-by advice is set for.
    ///
    /// # Errors
    /// As [`Buffer::advise`].
    ///
    /// Driver calls: `cuPointerGetAttributes` (unless the resource says managed),
    /// `cuDeviceGetCount`, `cuMemRangeGetAttribute`.
    pub fn accessed_by(&self) -> Result<Vec<MemLocation>, MemoryError> {
        Ok(self.managed_range("accessed_by")?.accessed_by()?)
    }

    /// Where the buffer was last prefetched to, `None` when it never was.
    ///
    /// # Errors
    /// As [`Buffer::advise`].
    ///
    /// Driver calls: as [`Buffer::preferred_location`].
    pub fn last_prefetch_location(&self) -> Result<Option<MemLocation>, MemoryError> {
        Ok(self
            .managed_range("last_prefetch_location")?
            .last_prefetch_location()?)
    }
}

fn ranges<'a>(
    buffers: &[&'a Buffer],
    operation: &'static str,
) -> Result<Vec<DeviceRange<'a>>, MemoryError> {
    buffers.iter().map(|b| b.managed_range(operation)).collect()
}

/// Migrates each buffer to its location (`locations[i]` for `buffers[i]`), ordered on
/// `stream`, in one driver call. Does not block.
///
/// # Errors
/// [`MemoryError::NotManaged`] when a buffer is not managed and [`MemoryError::Handle`]
/// (`HandleError::InvalidArgument`) for no buffers or not one location per buffer, before the
/// batch's driver call; [`MemoryError::Handle`] for the driver's refusal or a driver before CUDA
/// 12.8.
///
/// Driver calls: `cuPointerGetAttributes` per buffer whose resource does not say managed,
/// `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemPrefetchBatchAsync`.
pub fn prefetch_batch(
    buffers: &[&Buffer],
    locations: &[MemLocation],
    stream: &StreamHandle,
) -> Result<(), MemoryError> {
    let ranges = ranges(buffers, "prefetch_batch")?;
    Ok(handles::prefetch_batch(&ranges, locations, stream)?)
}

/// Discards the buffers' contents, ordered on `stream`, in one driver call. Does not block.
///
/// # Errors
/// As [`prefetch_batch`].
///
/// Driver calls: `cuPointerGetAttributes` per buffer whose resource does not say managed,
/// `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemDiscardBatchAsync`.
pub fn discard_batch(buffers: &[&Buffer], stream: &StreamHandle) -> Result<(), MemoryError> {
    let ranges = ranges(buffers, "discard_batch")?;
    Ok(handles::discard_batch(&ranges, stream)?)
}

/// Discards the buffers' contents and migrates each to its location, ordered on `stream`, in
/// one driver call. Does not block.
///
/// # Errors
/// As [`prefetch_batch`].
///
/// Driver calls: `cuPointerGetAttributes` per buffer whose resource does not say managed,
/// `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemDiscardAndPrefetchBatchAsync`.
pub fn discard_prefetch_batch(
    buffers: &[&Buffer],
    locations: &[MemLocation],
    stream: &StreamHandle,
) -> Result<(), MemoryError> {
    let ranges = ranges(buffers, "discard_prefetch_batch")?;
    Ok(handles::discard_prefetch_batch(&ranges, locations, stream)?)
}
