//! IPC: [`IpcBufferDescriptor`], the bytes another process needs to import a buffer from an
//! IPC-enabled pool, and [`Buffer::ipc_descriptor`] / [`Buffer::from_ipc_descriptor`].
//!
//! Sharing a buffer takes two things: the pool, once, as a POSIX file descriptor
//! ([`crate::PoolMemoryResource::export_pool`], opened in the other process with
//! `DeviceMemoryResource::import_pool` or `PinnedMemoryResource::import_pool`), and per buffer
//! the descriptor's bytes, sent any way the caller likes. Each import is a buffer of its own
//! with its own deallocation recipe (the stream given to the import); imports of one descriptor
//! share the process's one mapping, unmapped (`cuMemFreeAsync`) by the last of them on its own
//! recipe, ordered after the others' streams.

use std::sync::Arc;

use handles::{HandleError, StreamHandle};

use crate::buffer::IpcRole;
use crate::checks::{check_bound_stream_device, check_size};
use crate::{Buffer, IpcError, MemoryError, PoolMemoryResource};

const MAGIC: &[u8; 8] = b"CUSTDIPC";
const VERSION: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: how the pool travels.
const HANDLE_TYPE_POSIX_FD: u32 = 1;

/// What another process needs to import one buffer of an IPC-enabled pool: the pool's device
/// (or none, for a pinned host pool), the size in bytes and the driver's 64 bytes of pointer
/// export data (`CUmemPoolPtrExportData`).
///
/// Serialised by [`IpcBufferDescriptor::to_bytes`] to [`IpcBufferDescriptor::LEN`] bytes:
/// `b"CUSTDIPC"`, then little-endian `u32` version (1), `u32` handle type (1: the pool travels
/// as a POSIX file descriptor), `i32` device (-1: host), `u32` zero, `u64` size, and the 64
/// bytes of export data. [`IpcBufferDescriptor::from_bytes`] checks every field: bytes from
/// another process are untrusted, and a bad one is an error, never a panic.
#[derive(Clone, PartialEq, Eq)]
pub struct IpcBufferDescriptor {
    device: Option<i32>,
    size: usize,
    export_data: [u8; 64],
}

impl IpcBufferDescriptor {
    /// The length of the serialised form, in bytes.
    pub const LEN: usize = 96;

    /// The device the pool is on; `None` for a pinned host pool.
    pub fn device_id(&self) -> Option<i32> {
        self.device
    }

    /// The buffer's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A descriptor from its parts: the driver's export data for the pointer
    /// (`CUmemPoolPtrExportData`), the buffer's size in bytes and its pool's device (`None` for
    /// a pinned host pool).
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`] for a size of zero or more than `isize::MAX`;
    /// [`MemoryError::Ipc`] for a device below 0.
    pub fn from_parts(
        export_data: [u8; 64],
        size: usize,
        device: Option<i32>,
    ) -> Result<IpcBufferDescriptor, MemoryError> {
        check_size(size)?;
        if device.is_some_and(|d| d < 0) {
            return Err(IpcError::DescriptorDevice(device.unwrap_or(-1)).into());
        }
        Ok(IpcBufferDescriptor {
            device,
            size,
            export_data,
        })
    }

    /// The driver's export data for the pointer.
    pub fn export_data(&self) -> &[u8; 64] {
        &self.export_data
    }

    /// The serialised form.
    pub fn to_bytes(&self) -> [u8; IpcBufferDescriptor::LEN] {
        let mut out = [0u8; IpcBufferDescriptor::LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&HANDLE_TYPE_POSIX_FD.to_le_bytes());
        out[16..20].copy_from_slice(&self.device.unwrap_or(-1).to_le_bytes());
        // 20..24 stay zero.
        out[24..32].copy_from_slice(&(self.size as u64).to_le_bytes());
        out[32..].copy_from_slice(&self.export_data);
        out
    }

    /// Parses the serialised form.
    ///
    /// # Errors
    /// [`MemoryError::Ipc`] for a wrong length, magic, version or handle type, a device below
    /// -1, non-zero reserved bytes; [`MemoryError::InvalidSize`] for a size of zero or more
    /// than `isize::MAX`.
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcBufferDescriptor, MemoryError> {
        let bytes: &[u8; IpcBufferDescriptor::LEN] =
            bytes.try_into().map_err(|_| IpcError::DescriptorLength {
                expected: IpcBufferDescriptor::LEN,
                len: bytes.len(),
            })?;
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        if &bytes[..8] != MAGIC {
            return Err(IpcError::NotADescriptor.into());
        }
        if u32_at(8) != VERSION {
            return Err(IpcError::DescriptorVersion(u32_at(8)).into());
        }
        if u32_at(12) != HANDLE_TYPE_POSIX_FD {
            return Err(IpcError::DescriptorHandleType(u32_at(12)).into());
        }
        let device = u32_at(16) as i32;
        if device < -1 {
            return Err(IpcError::DescriptorDevice(device).into());
        }
        if u32_at(20) != 0 {
            return Err(IpcError::DescriptorReserved.into());
        }
        let mut size = [0u8; 8];
        size.copy_from_slice(&bytes[24..32]);
        let size = u64::from_le_bytes(size);
        let size = usize::try_from(size).map_err(|_| MemoryError::InvalidSize {
            size: usize::MAX,
            reason: "the descriptor's size does not fit in this process's address space",
        })?;
        check_size(size)?;
        let mut export_data = [0u8; 64];
        export_data.copy_from_slice(&bytes[32..]);
        Ok(IpcBufferDescriptor {
            device: (device >= 0).then_some(device),
            size,
            export_data,
        })
    }
}

impl std::fmt::Debug for IpcBufferDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IpcBufferDescriptor(device {:?}, {} bytes)",
            self.device, self.size
        )
    }
}

impl Buffer {
    /// The descriptor another process needs to import this buffer (with the pool, exported
    /// once by [`PoolMemoryResource::export_pool`]).
    ///
    /// # Errors
    /// [`MemoryError::Ipc`] for a buffer that does not come from an
    /// IPC-enabled pool (or was itself imported); [`MemoryError::Handle`] for the driver's
    /// failure.
    ///
    /// Driver calls: `cuMemPoolExportPointer`.
    pub fn ipc_descriptor(&self) -> Result<IpcBufferDescriptor, MemoryError> {
        let handle = self.handle();
        match self.ipc_role() {
            IpcRole::Exportable => {}
            IpcRole::Imported => return Err(IpcError::BufferImported.into()),
            IpcRole::None => return Err(IpcError::BufferNotExportable.into()),
        }
        let export_data = handles::export_pointer(handle)?;
        Ok(IpcBufferDescriptor {
            device: handle.pool().and_then(|pool| pool.device()),
            size: handle.size(),
            export_data,
        })
    }

    /// Imports the buffer `descriptor` describes from `mr`, a pool imported from the exporting
    /// process, with `stream` ordering its eventual free (required: there is no implicit
    /// default).
    ///
    /// Each import is a buffer of its own, with its own recipe. The driver maps an allocation
    /// once per process, so imports of one descriptor share that mapping: it is unmapped when
    /// the last of them goes, on that one's deallocation stream, after the work queued on the
    /// others' deallocation streams when they went (an event each). Imports are serialised with
    /// that unmap, so a new import never picks up a mapping about to go.
    ///
    /// # Errors
    /// - [`MemoryError::Ipc`]: `mr` is not an imported pool; the imported allocation is smaller
    ///   than the descriptor claims (a mapping made for the check is freed again on `stream`).
    /// - [`HandleError::WrongDevice`](handles::HandleError::WrongDevice): the descriptor's device is not the pool's, or `stream`
    ///   is on another device.
    /// - [`MemoryError::Handle`]: the driver rejects the export data; no current context for a
    ///   default-stream token.
    ///
    /// Driver calls: `cuCtxGetCurrent` (a default-stream token), and for the first import of a
    /// mapping `cuCtxSetCurrent` (if needed), `cuMemPoolImportPointer`, `cuPointerGetAttributes`
    /// (the extent check). At release: `cuEventCreate` and `cuEventRecord` while other imports
    /// hold the mapping; for the last, `cuStreamWaitEvent` per earlier release, then
    /// `cuMemFreeAsync`.
    pub fn from_ipc_descriptor<R: PoolMemoryResource>(
        mr: &Arc<R>,
        descriptor: &IpcBufferDescriptor,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        if !mr.is_mapped() {
            return Err(IpcError::NotAnImportedPool.into());
        }
        let pool = mr.pool();
        if descriptor.device != pool.device() {
            return Err(MemoryError::wrong_device(
                pool.device().unwrap_or(-1),
                descriptor.device.unwrap_or(-1),
            ));
        }
        if let Some(device) = pool.device() {
            check_bound_stream_device(stream, device)?;
        }
        // The handles crate's one registry of imported mappings: imports of one descriptor share
        // the process's mapping, each with its own recipe (validated before anything is imported).
        let handle =
            handles::import_pointer(pool, &descriptor.export_data, descriptor.size, stream)
                .map_err(|error| match error {
                    // The mapped allocation is smaller than the descriptor claims.
                    HandleError::ImportExceedsMapping { claimed, extent } => {
                        IpcError::ClaimExceedsMapping { claimed, extent }.into()
                    }
                    error => MemoryError::Handle(error),
                })?;
        let mr: Arc<R> = Arc::clone(mr);
        let access = mr.accessibility();
        Ok(Buffer::new(
            handle,
            Some(mr),
            Some(access),
            IpcRole::Imported,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IpcBufferDescriptor {
        let mut export_data = [0u8; 64];
        for (i, b) in export_data.iter_mut().enumerate() {
            *b = i as u8;
        }
        IpcBufferDescriptor {
            device: Some(1),
            size: 4096,
            export_data,
        }
    }

    #[test]
    fn round_trips() {
        let d = sample();
        let bytes = d.to_bytes();
        assert_eq!(IpcBufferDescriptor::from_bytes(&bytes), Ok(d));
        let host = IpcBufferDescriptor {
            device: None,
            ..sample()
        };
        let back = IpcBufferDescriptor::from_bytes(&host.to_bytes()).unwrap();
        assert_eq!(back.device_id(), None);
        assert_eq!(back.size(), 4096);
        assert_eq!(back.export_data()[63], 63);
    }

    #[test]
    fn rejects_malformed_bytes_without_panicking() {
        let good = sample().to_bytes();
        let mut cases: Vec<Vec<u8>> =
            vec![Vec::new(), good[..95].to_vec(), [&good[..], &[0]].concat()];
        for (at, value) in [(0, b'X'), (8, 2), (12, 2), (16, 0xfe), (20, 1)] {
            let mut bad = good.to_vec();
            bad[at] = value;
            if at == 16 {
                bad[17..20].copy_from_slice(&[0xff, 0xff, 0xff]); // -2
            }
            cases.push(bad);
        }
        for bad in &cases {
            assert!(
                matches!(
                    IpcBufferDescriptor::from_bytes(bad),
                    Err(MemoryError::Ipc(_))
                ),
                "{bad:?}"
            );
        }
        for size in [0u64, u64::MAX] {
            let mut bad = good.to_vec();
            bad[24..32].copy_from_slice(&size.to_le_bytes());
            assert!(matches!(
                IpcBufferDescriptor::from_bytes(&bad),
                Err(MemoryError::InvalidSize { .. })
            ));
        }
        // Every single-byte corruption of the header parses or errors; none panics.
        for at in 0..32 {
            for value in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut bytes = good;
                bytes[at] = value;
                let _ = IpcBufferDescriptor::from_bytes(&bytes);
            }
        }
    }
}
