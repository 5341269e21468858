//! The checks every operation shares, before its first driver call: sizes, and which device a
//! stream runs on (refused as the handles crate refuses it, [`HandleError::WrongDevice`]).

use handles::{ContextHandle, HandleError, StreamHandle};

use crate::MemoryError;

/// Rejects sizes no allocation can have.
#[inline]
pub(crate) fn check_size(size: usize) -> Result<(), MemoryError> {
    if size == 0 {
        return Err(MemoryError::InvalidSize {
            size,
            reason: "an allocation needs at least one byte",
        });
    }
    if size > isize::MAX as usize {
        return Err(MemoryError::InvalidSize {
            size,
            reason: "no allocation can exceed isize::MAX bytes",
        });
    }
    Ok(())
}

/// The device `stream` runs on: its context's, or for an unbound default-stream token the
/// device of the context current on the calling thread.
///
/// Driver calls: `cuCtxGetCurrent` (unbound tokens only).
pub(crate) fn stream_device(stream: &StreamHandle) -> Result<i32, MemoryError> {
    match stream.context() {
        Some(context) => Ok(context.device()),
        None => Ok(ContextHandle::current()?
            .ok_or(HandleError::NoCurrentContext)?
            .device()),
    }
}

/// Checks that `stream` runs on `device` when that needs no driver call (a stream that
/// carries its context); an unbound token is left to the handles crate, whose error
/// [`HandleError::WrongDevice`] is the same error.
#[inline]
pub(crate) fn check_bound_stream_device(
    stream: &StreamHandle,
    device: i32,
) -> Result<(), MemoryError> {
    match stream.context() {
        Some(context) if context.device() != device => {
            Err(MemoryError::wrong_device(device, context.device()))
        }
        _ => Ok(()),
    }
}

/// Checks that `stream` runs on `device`, resolving an unbound token against the current
/// context.
///
/// Driver calls: `cuCtxGetCurrent` (unbound tokens only).
pub(crate) fn check_stream_device(stream: &StreamHandle, device: i32) -> Result<(), MemoryError> {
    let found = stream_device(stream)?;
    if found != device {
        return Err(MemoryError::wrong_device(device, found));
    }
    Ok(())
}
