//! [`Buffer`] (memory with its deallocation recipe, shareable across threads, closed once) and
//! [`ManagedBuffer`]; adoption of foreign pointers ([`Buffer::from_handle`], [`Ownership`]);
//! copies and fills.

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use handles::ops::{self, MemoryType};
use handles::sys_types::CUdeviceptr;
use handles::{DevicePtrHandle, HandleError, ReleaseKind, StreamHandle};

use crate::resource::{
    check_size, check_stream_device, device_error, stream_device, taken_on_trust,
};
use crate::{MemoryError, MemoryResource};

/// Who owns memory handed to [`Buffer::from_handle`], and so what happens when the buffer is
/// closed or dropped.
pub enum Ownership {
    /// Nobody, as far as the buffer knows: nothing happens at close, and the caller keeps the
    /// memory alive while the buffer is used.
    Borrowed,
    /// `owner` keeps the memory alive: it is dropped with the buffer's last reference and
    /// nothing is freed.
    Owner(Box<dyn Any + Send + Sync>),
    /// The buffer owns the memory: the resource frees it at teardown
    /// (`deallocate(ptr, size, stream)` with the recorded stream, or the resource's own release
    /// rule; see [`MemoryResource::adopt`]).
    MemoryResource(Arc<dyn MemoryResource>),
}

impl fmt::Debug for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ownership::Borrowed => "Borrowed",
            Ownership::Owner(_) => "Owner(..)",
            Ownership::MemoryResource(_) => "MemoryResource(..)",
        })
    }
}

/// Where memory can be used from, fixed when a buffer is made (from its memory resource) or
/// read once from the driver's pointer attributes (adopted views).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub(crate) device: bool,
    pub(crate) host: bool,
    pub(crate) device_id: Option<i32>,
    pub(crate) managed: bool,
}

impl Access {
    pub(crate) fn of(mr: &dyn MemoryResource) -> Access {
        Access {
            device: mr.is_device_accessible(),
            host: mr.is_host_accessible(),
            device_id: mr.device_id(),
            managed: mr.is_managed(),
        }
    }

    const MANAGED: Access = Access {
        device: true,
        host: true,
        device_id: None,
        managed: true,
    };

    /// The device whose streams must order work on this memory: device-only memory's device;
    /// `None` for memory any device's stream may touch (host, pinned, managed).
    fn bound_device(self) -> Option<i32> {
        (self.device && !self.host && !self.managed)
            .then_some(self.device_id)
            .flatten()
    }
}

/// How a buffer takes part in IPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IpcRole {
    None,
    /// Allocated from an IPC-enabled pool: [`Buffer::ipc_descriptor`] works.
    Exportable,
    /// Imported from another process ([`Buffer::from_ipc_descriptor`]).
    Imported,
}

/// What an open buffer holds; taken out, whole, by the one close that wins.
struct Open {
    handle: DevicePtrHandle,
    mr: Option<Arc<dyn MemoryResource>>,
}

/// A range of device, pinned host or managed memory, with the deallocation recipe that will
/// order and legalise its free (docs/decisions.md D1).
///
/// A buffer is `Send + Sync` and every method takes `&self`, so it can be shared (an `Arc`,
/// a Python object) and closed from any thread:
///
/// - [`Buffer::close`] frees now (when this buffer holds the last reference to the memory)
///   and returns the free's error. Close is atomic and idempotent: of two concurrent closes
///   one frees and the other is a no-op; closing a closed buffer is `Ok`.
/// - Dropping an open buffer frees the same way but never waits on the GPU
///   (docs/decisions.md D9) and reports a failure through the cleanup-error hook
///   (`handles::set_cleanup_error_hook`).
/// - [`Buffer::set_deallocation_stream`] hands the free over to another stream: the recipe is
///   replaced atomically, seen by every other holder of the memory (a graph, a clone of the
///   [`DevicePtrHandle`]), and nothing is freed or synchronised.
///
/// Copies and fills hold a reference to the memory while they are issued; a buffer closed
/// meanwhile on another thread is then freed when that reference goes (reported, not
/// returned). Ordering work on other streams before the free is the caller's job: record an
/// event, wait on it from the deallocation stream, or hand the free over to the stream that
/// used the memory last.
pub struct Buffer {
    state: Mutex<Option<Open>>,
    access: OnceLock<Access>,
    ipc: IpcRole,
}

impl Buffer {
    /// A buffer for memory a resource just allocated (or imported).
    #[inline]
    pub(crate) fn new(
        handle: DevicePtrHandle,
        mr: Option<Arc<dyn MemoryResource>>,
        access: Option<Access>,
        ipc: IpcRole,
    ) -> Buffer {
        let cell = OnceLock::new();
        if let Some(access) = access {
            let _ = cell.set(access);
        }
        Buffer {
            state: Mutex::new(Some(Open { handle, mr })),
            access: cell,
            ipc,
        }
    }

    /// Wraps `size` bytes at `ptr`, allocated elsewhere, as a buffer owned as `ownership` says
    /// (docs/decisions.md D5).
    ///
    /// With [`Ownership::MemoryResource`], the buffer owns the memory and `stream` orders its
    /// free (`None`: the legacy default stream, bound to the context current now; prefer a
    /// created stream if the buffer may be freed on another thread). The recipe is recorded and
    /// checked *before* ownership is taken, so on any error the pointer is still the caller's
    /// and the resource's `deallocate` has not been called.
    ///
    /// # Errors
    /// - [`MemoryError::OwnershipConflict`]: a `stream` with [`Ownership::Borrowed`] or
    ///   [`Ownership::Owner`] (nothing would be freed on it). (A memory resource together
    ///   with an owner cannot be expressed.)
    /// - [`MemoryError::InvalidSize`]: an owned range of zero bytes or more than `isize::MAX`.
    /// - [`MemoryError::WrongDevice`]: a stream of another device than the resource's.
    /// - [`MemoryError::Handle`]: a null owned pointer ([`handles::HandleError::InvalidArgument`]);
    ///   [`handles::HandleError::NoCurrentContext`] for a default-stream token (or `None`) on a
    ///   thread with no current context.
    ///
    /// On error an [`Ownership::Owner`] is dropped (it frees nothing).
    ///
    /// Driver calls: none for views; `cuCtxGetCurrent` for a default-stream token with a
    /// memory resource.
    pub fn from_handle(
        ptr: CUdeviceptr,
        size: usize,
        ownership: Ownership,
        stream: Option<&StreamHandle>,
    ) -> Result<Buffer, MemoryError> {
        Buffer::adopt(ptr, size, ownership, stream, None)
    }

    fn adopt(
        ptr: CUdeviceptr,
        size: usize,
        ownership: Ownership,
        stream: Option<&StreamHandle>,
        access: Option<Access>,
    ) -> Result<Buffer, MemoryError> {
        match ownership {
            Ownership::MemoryResource(mr) => {
                check_size(size)?;
                let legacy;
                let stream = match stream {
                    Some(stream) => stream,
                    None => {
                        legacy = StreamHandle::legacy();
                        &legacy
                    }
                };
                let mr_access = Access::of(mr.as_ref());
                let handle = Arc::clone(&mr).adopt(ptr, size, stream)?;
                Ok(Buffer::new(
                    handle,
                    Some(mr),
                    Some(access.unwrap_or(mr_access)),
                    IpcRole::None,
                ))
            }
            Ownership::Borrowed | Ownership::Owner(_) if stream.is_some() => {
                Err(MemoryError::OwnershipConflict {
                    reason: "a deallocation stream needs a memory resource to free with",
                })
            }
            Ownership::Borrowed => Ok(Buffer::new(
                #[allow(unsafe_code)]
                // SAFETY: NOT checked here: this safe function passes on its caller's word that
                // the memory stays valid while the buffer is used (until `from_handle` takes a handle).
                unsafe {
                    handles::raw::borrowed(ptr, size)
                },
                None,
                access,
                IpcRole::None,
            )),
            Ownership::Owner(owner) => Ok(Buffer::new(
                #[allow(unsafe_code)]
                // SAFETY: NOT checked here: this safe function passes on its caller's word that
                // `owner` keeps the memory valid (until `from_handle` takes a handle).
                unsafe {
                    handles::raw::with_owner(ptr, size, owner)?
                },
                None,
                access,
                IpcRole::None,
            )),
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, Option<Open>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The address (a host address for pinned host memory); 0 once closed.
    pub fn ptr(&self) -> CUdeviceptr {
        self.lock().as_ref().map_or(0, |open| open.handle.ptr())
    }

    /// The size in bytes; 0 once closed.
    pub fn size(&self) -> usize {
        self.lock().as_ref().map_or(0, |open| open.handle.size())
    }

    /// Whether the buffer was closed.
    pub fn is_closed(&self) -> bool {
        self.lock().is_none()
    }

    /// The resource the memory came from (or that frees it); `None` for views and once
    /// closed.
    pub fn memory_resource(&self) -> Option<Arc<dyn MemoryResource>> {
        self.lock().as_ref().and_then(|open| open.mr.clone())
    }

    /// A new reference to the memory (for a graph attachment, say): it keeps the memory alive
    /// after the buffer is closed and sees every change of recipe.
    ///
    /// # Errors
    /// [`MemoryError::Closed`].
    pub fn handle(&self) -> Result<DevicePtrHandle, MemoryError> {
        self.lock()
            .as_ref()
            .map(|open| open.handle.clone())
            .ok_or(MemoryError::Closed)
    }

    /// The stream the free is recorded on now; `None` for views, which free nothing.
    ///
    /// # Errors
    /// [`MemoryError::Closed`].
    pub fn deallocation_stream(&self) -> Result<Option<StreamHandle>, MemoryError> {
        Ok(self.handle()?.deallocation_stream())
    }

    /// Whether the memory was imported from another process.
    pub fn is_mapped(&self) -> bool {
        self.ipc == IpcRole::Imported
    }

    pub(crate) fn ipc_role(&self) -> IpcRole {
        self.ipc
    }

    /// Records the free on `stream` from now on (docs/decisions.md D4): the whole recipe (stream,
    /// context, per-thread-default-stream thread) is replaced in one atomic step that every
    /// holder of the memory sees. Nothing is freed or synchronised: work queued on the old
    /// stream must be ordered before the new one by the caller. On error the old recipe
    /// stays. For views, which free nothing, nothing is recorded.
    ///
    /// # Errors
    /// - [`MemoryError::Closed`].
    /// - [`MemoryError::WrongDevice`]: a stream of another device than the memory's.
    /// - [`MemoryError::Handle`] with [`handles::HandleError::NoCurrentContext`]: a
    ///   default-stream token on a thread with no current context.
    ///
    /// Driver calls: `cuCtxGetCurrent` (default-stream tokens only).
    pub fn set_deallocation_stream(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        // The old recipe may hold the last handle of a stream: released outside the lock.
        drop(self.replace_deallocation_stream(stream)?);
        Ok(())
    }

    /// [`set_deallocation_stream`](Self::set_deallocation_stream), returning the replaced
    /// recipe instead of dropping it (`None` for memory without a recipe), so that the caller
    /// chooses where a last reference to the old stream or context is dropped
    /// ([`DeallocationRecipe::into_last_references`](handles::DeallocationRecipe::into_last_references)).
    ///
    /// # Errors
    /// As [`set_deallocation_stream`](Self::set_deallocation_stream).
    ///
    /// Driver calls: `cuCtxGetCurrent` (default-stream tokens only); none for a stream that
    /// carries its context (created or foreign), also on the error paths.
    pub fn replace_deallocation_stream(
        &self,
        stream: &StreamHandle,
    ) -> Result<Option<handles::DeallocationRecipe>, MemoryError> {
        let guard = self.lock();
        let open = guard.as_ref().ok_or(MemoryError::Closed)?;
        let handle_device = open.handle.device();
        if handle_device.is_none() {
            // Adopted memory: the handle does not know its device, the resource does.
            if let Some(device) = self.access.get().and_then(|a| a.bound_device()) {
                check_stream_device(stream, device)?;
            }
        }
        open.handle
            .replace_deallocation_stream(stream)
            .map_err(device_error)
    }

    /// Closes the buffer: when it holds the last reference to the memory, frees it now with
    /// the recorded recipe and returns the outcome. Closing a closed buffer is `Ok`. Atomic:
    /// of concurrent closes exactly one releases the memory.
    ///
    /// May block: memory whose free is synchronous in the driver (`cuMemAlloc`, pinned host,
    /// managed) is freed after the deallocation stream has drained. Stream-ordered frees do
    /// not wait.
    ///
    /// # Errors
    /// The free's failure ([`MemoryError::Handle`]: the driver's error, a memory resource's
    /// `deallocate` error, a context that could not be made current or restored). The buffer is
    /// closed either way.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (when the recipe's context is not
    /// current), and the free (`cuMemFreeAsync`; `cuStreamSynchronize` then `cuMemFree_v2` or
    /// `cuMemFreeHost`; the resource's `deallocate`).
    pub fn close(&self) -> Result<(), MemoryError> {
        let open = self.lock().take();
        let Some(Open { handle, mr }) = open else {
            return Ok(());
        };
        let result = handle.release();
        drop(mr);
        Ok(result?)
    }

    /// [`Buffer::set_deallocation_stream`]`(stream)` then [`Buffer::close`] (docs/decisions.md D4).
    /// If recording the new recipe fails, the buffer stays open with its old recipe.
    ///
    /// # Errors
    /// As [`Buffer::set_deallocation_stream`] (including [`MemoryError::Closed`] for a closed
    /// buffer, like the setter), then as [`Buffer::close`].
    ///
    /// Driver calls: those of both.
    pub fn close_on(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        self.set_deallocation_stream(stream)?;
        self.close()
    }

    /// How the memory can be used: from the memory resource, else (once) from the driver.
    fn access(&self, ptr: CUdeviceptr) -> Result<Access, MemoryError> {
        if let Some(access) = self.access.get() {
            return Ok(*access);
        }
        let access = match ops::pointer_attributes(ptr)? {
            // Unknown to the driver: ordinary (pageable) host memory.
            None => Access {
                device: false,
                host: true,
                device_id: None,
                managed: false,
            },
            Some(attributes) if attributes.is_managed => Access {
                device_id: (attributes.device_ordinal >= 0).then_some(attributes.device_ordinal),
                ..Access::MANAGED
            },
            Some(attributes) if attributes.memory_type == MemoryType::Host => Access {
                device: true,
                host: true,
                device_id: None,
                managed: false,
            },
            Some(attributes) => Access {
                device: true,
                host: false,
                device_id: (attributes.device_ordinal >= 0).then_some(attributes.device_ordinal),
                managed: false,
            },
        };
        Ok(*self.access.get_or_init(|| access))
    }

    /// Whether a device can access the memory.
    ///
    /// # Errors
    /// [`MemoryError::Closed`]; [`MemoryError::Handle`] when the pointer-attribute query of a
    /// view fails.
    ///
    /// Driver calls: `cuPointerGetAttribute`, for views, once.
    pub fn is_device_accessible(&self) -> Result<bool, MemoryError> {
        let handle = self.handle()?;
        Ok(self.access(handle.ptr())?.device)
    }

    /// Whether the host can access the memory.
    ///
    /// # Errors
    /// As [`Buffer::is_device_accessible`].
    ///
    /// Driver calls: as [`Buffer::is_device_accessible`].
    pub fn is_host_accessible(&self) -> Result<bool, MemoryError> {
        let handle = self.handle()?;
        Ok(self.access(handle.ptr())?.host)
    }

    /// Whether the memory is managed.
    ///
    /// # Errors
    /// As [`Buffer::is_device_accessible`].
    ///
    /// Driver calls: as [`Buffer::is_device_accessible`].
    pub fn is_managed(&self) -> Result<bool, MemoryError> {
        let handle = self.handle()?;
        Ok(self.access(handle.ptr())?.managed)
    }

    /// The device the memory lives on or belongs to; `None` for memory bound to no device
    /// (pinned or pageable host memory).
    ///
    /// # Errors
    /// As [`Buffer::is_device_accessible`].
    ///
    /// Driver calls: as [`Buffer::is_device_accessible`].
    pub fn device_id(&self) -> Result<Option<i32>, MemoryError> {
        let handle = self.handle()?;
        Ok(self.access(handle.ptr())?.device_id)
    }

    /// The device whose streams may order work on this memory (`None`: any).
    fn ops_device(&self, handle: &DevicePtrHandle) -> Result<Option<i32>, MemoryError> {
        let access = self.access(handle.ptr())?;
        if access.host || access.managed {
            return Ok(None);
        }
        Ok(handle.device().or(access.device_id))
    }

    /// Copies this buffer into `dst`, ordered on `stream`. Does not block. Both buffers must
    /// stay open (or their frees be ordered after `stream`) until the copy has run.
    ///
    /// # Errors
    /// - [`MemoryError::Closed`]: either buffer is closed.
    /// - [`MemoryError::SizeMismatch`]: the sizes differ.
    /// - [`MemoryError::WrongDevice`]: both buffers are device memory and the stream is on
    ///   neither's device.
    /// - [`MemoryError::Handle`]: the driver's failure; no current context for a token.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemcpyAsync`.
    pub fn copy_to(&self, dst: &Buffer, stream: &StreamHandle) -> Result<(), MemoryError> {
        let src_handle = self.handle()?;
        let dst_handle = dst.handle()?;
        if src_handle.size() != dst_handle.size() {
            return Err(MemoryError::SizeMismatch {
                src: src_handle.size(),
                dst: dst_handle.size(),
            });
        }
        let devices = [self.ops_device(&src_handle)?, dst.ops_device(&dst_handle)?];
        if let [Some(first), second] | [second, Some(first)] = devices {
            let found = stream_device(stream)?;
            if found != first && second != Some(found) {
                return Err(MemoryError::WrongDevice {
                    expected: first,
                    found,
                });
            }
        }
        src_handle
            .as_range()
            .copy_to(&dst_handle.as_range(), stream)?;
        Ok(())
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
        let mr = self.lock().as_ref().ok_or(MemoryError::Closed)?.mr.clone();
        let mr = mr.ok_or(MemoryError::NoMemoryResource)?;
        let new = mr.allocate(self.handle()?.size(), stream)?;
        self.copy_to(&new, stream)?;
        Ok(new)
    }

    /// Fills the buffer with `value` (an 8-, 16- or 32-bit pattern, repeated), ordered on
    /// `stream`. Does not block.
    ///
    /// # Errors
    /// - [`MemoryError::Closed`].
    /// - [`MemoryError::InvalidFill`]: the size or the address is not a multiple of the
    ///   pattern's width.
    /// - [`MemoryError::WrongDevice`]: device memory and a stream of another device.
    /// - [`MemoryError::Handle`]: the driver's failure; no current context for a token.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), one of
    /// `cuMemsetD8Async`, `cuMemsetD16Async`, `cuMemsetD32Async`.
    pub fn fill(
        &self,
        value: impl Into<FillValue>,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        let value = value.into();
        let handle = self.handle()?;
        let width = value.width();
        if handle.size() % width != 0 {
            return Err(MemoryError::InvalidFill {
                width,
                reason: "the buffer's size is not a multiple of the pattern's width",
            });
        }
        if handle.ptr() % width as u64 != 0 {
            return Err(MemoryError::InvalidFill {
                width,
                reason: "the buffer's address is not aligned to the pattern's width",
            });
        }
        if let Some(device) = self.ops_device(&handle)? {
            check_stream_device(stream, device)?;
        }
        let range = handle.as_range();
        match value {
            FillValue::U8(v) => range.fill_u8(v, stream)?,
            FillValue::U16(v) => range.fill_u16(v, stream)?,
            FillValue::U32(v) => range.fill_u32(v, stream)?,
        }
        Ok(())
    }

    /// Copies the whole buffer into `dst` on the host, ordered on `stream` after the work
    /// queued there, and **blocks** until the bytes have arrived.
    ///
    /// # Errors
    /// [`MemoryError::Closed`]; [`MemoryError::SizeMismatch`] unless `dst.len()` is the
    /// buffer's size; [`MemoryError::WrongDevice`] as [`Buffer::fill`];
    /// [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemcpyAsync`,
    /// `cuStreamSynchronize`.
    pub fn copy_to_host(&self, dst: &mut [u8], stream: &StreamHandle) -> Result<(), MemoryError> {
        let handle = self.host_copy_checks(dst.len(), stream, true)?;
        Ok(handle.as_range().copy_to_host(dst, stream)?)
    }

    /// Copies `src` from the host into the whole buffer, ordered on `stream` after the work
    /// queued there, and **blocks** until the copy has finished.
    ///
    /// # Errors
    /// As [`Buffer::copy_to_host`].
    ///
    /// Driver calls: as [`Buffer::copy_to_host`].
    pub fn copy_from_host(&self, src: &[u8], stream: &StreamHandle) -> Result<(), MemoryError> {
        let handle = self.host_copy_checks(src.len(), stream, false)?;
        Ok(handle.as_range().copy_from_host(src, stream)?)
    }

    fn host_copy_checks(
        &self,
        host_len: usize,
        stream: &StreamHandle,
        to_host: bool,
    ) -> Result<DevicePtrHandle, MemoryError> {
        let handle = self.handle()?;
        if host_len != handle.size() {
            let (src, dst) = if to_host {
                (handle.size(), host_len)
            } else {
                (host_len, handle.size())
            };
            return Err(MemoryError::SizeMismatch { src, dst });
        }
        if let Some(device) = self.ops_device(&handle)? {
            check_stream_device(stream, device)?;
        }
        Ok(handle)
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lock().as_ref() {
            None => f.write_str("Buffer(closed)"),
            Some(open) => {
                write!(
                    f,
                    "Buffer(0x{:x}, {} bytes",
                    open.handle.ptr(),
                    open.handle.size()
                )?;
                if self.ipc == IpcRole::Imported {
                    f.write_str(", mapped")?;
                }
                f.write_str(")")
            }
        }
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

/// A [`Buffer`] of managed memory (`cuMemAllocManaged`): accessible from the host and every
/// device. Dereferences to [`Buffer`].
pub struct ManagedBuffer(Buffer);

impl ManagedBuffer {
    pub(crate) fn new(buffer: Buffer) -> ManagedBuffer {
        ManagedBuffer(buffer)
    }

    /// Wraps `size` bytes of managed memory at `ptr`, allocated elsewhere, as
    /// [`Buffer::from_handle`] does; the buffer reports itself managed, host- and
    /// device-accessible without asking the driver (the caller vouches that the memory is
    /// managed). A [`crate::ManagedMemoryResource`] as owner releases it like memory it
    /// allocated (without blocking a drop).
    ///
    /// # Errors
    /// As [`Buffer::from_handle`].
    ///
    /// Driver calls: as [`Buffer::from_handle`].
    pub fn from_handle(
        ptr: CUdeviceptr,
        size: usize,
        ownership: Ownership,
        stream: Option<&StreamHandle>,
    ) -> Result<ManagedBuffer, MemoryError> {
        let access = match &ownership {
            Ownership::MemoryResource(mr) => Access {
                device_id: mr.device_id(),
                ..Access::MANAGED
            },
            _ => Access::MANAGED,
        };
        Buffer::adopt(ptr, size, ownership, stream, Some(access)).map(ManagedBuffer)
    }

    /// The plain buffer.
    pub fn into_buffer(self) -> Buffer {
        self.0
    }
}

impl Deref for ManagedBuffer {
    type Target = Buffer;

    fn deref(&self) -> &Buffer {
        &self.0
    }
}

impl fmt::Debug for ManagedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Managed{:?}", self.0)
    }
}

/// The release rule matching a synchronous resource's memory, for [`MemoryResource::adopt`].
pub(crate) fn adopt_synchronous(
    ptr: CUdeviceptr,
    size: usize,
    kind: ReleaseKind,
    device: Option<i32>,
    stream: &StreamHandle,
) -> Result<DevicePtrHandle, MemoryError> {
    DevicePtrHandle::adopt_synchronous(taken_on_trust(ptr, size), kind, device, stream)
        .map_err(|error| device_error(HandleError::from(error)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Buffer>();
        check::<ManagedBuffer>();
        check::<Arc<dyn MemoryResource>>();
    }

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

    #[test]
    fn a_stream_without_a_memory_resource_is_a_conflict_and_takes_nothing() {
        let stream = StreamHandle::legacy();
        for ownership in [Ownership::Borrowed, Ownership::Owner(Box::new(5u8))] {
            let error = Buffer::from_handle(0x1000, 64, ownership, Some(&stream)).unwrap_err();
            assert!(
                matches!(error, MemoryError::OwnershipConflict { .. }),
                "{error}"
            );
        }
    }

    #[test]
    fn views_need_no_driver() {
        let view = Buffer::from_handle(0x1000, 64, Ownership::Borrowed, None).unwrap();
        assert_eq!((view.ptr(), view.size()), (0x1000, 64));
        assert!(view.memory_resource().is_none());
        assert_eq!(view.deallocation_stream().unwrap().map(|_| ()), None);
        view.close().unwrap();
        assert!(view.is_closed());
        assert_eq!((view.ptr(), view.size()), (0, 0));
        view.close().unwrap();
        assert_eq!(
            view.set_deallocation_stream(&StreamHandle::legacy()),
            Err(MemoryError::Closed)
        );
        assert_eq!(
            view.fill(1u8, &StreamHandle::legacy()),
            Err(MemoryError::Closed)
        );
    }
}
