//! Adoption from raw addresses for the memory tests: what the Python bindings'
//! `Buffer.from_handle(ptr, size, mr=..., owner=..., stream=...)` does, in terms of the safe API
//! ([`Buffer::adopt`], [`Buffer::from_parts`]) and the unsafe constructors of `handles::raw`.
//!
//! The tests hand the crate addresses they own (memory they allocated and gave up, a host
//! vector they keep, or bad input that adoption refuses before taking anything), as a Python
//! caller does; each `unsafe` block says so.

#![allow(dead_code)]

use std::any::Any;
use std::sync::Arc;

use handles::sys_types::CUdeviceptr;
use handles::StreamHandle;
use memory::{Buffer, ManagedBuffer, MemoryError, MemoryResource};

/// Who owns memory handed to [`from_handle`], and so what happens when the buffer is closed
/// or dropped.
pub enum Ownership {
    /// Nobody: nothing happens at close, and the test keeps the memory alive.
    Borrowed,
    /// `owner` keeps the memory alive: dropped with the buffer's last reference.
    Owner(Box<dyn Any + Send + Sync>),
    /// The buffer owns the memory: the resource frees it at teardown.
    MemoryResource(Arc<dyn MemoryResource>),
}

/// `size` bytes at `ptr` as a buffer owned as `ownership` says; a stream with a non-owning
/// buffer is refused ([`MemoryError::OwnershipConflict`]), as the bindings refuse it. A refused
/// adoption leaves the memory with the test.
pub fn from_handle(
    ptr: CUdeviceptr,
    size: usize,
    ownership: Ownership,
    stream: Option<&StreamHandle>,
) -> Result<Buffer, MemoryError> {
    match ownership {
        Ownership::MemoryResource(mr) => {
            // SAFETY: the test owns `size` bytes at `ptr` and gives them to the buffer (or passes
            // bad input that the adoption refuses, giving the token back, before taking it).
            let allocation = unsafe { handles::raw::owned_allocation(ptr, size) };
            Buffer::adopt(allocation, mr, stream).map_err(given_back)
        }
        Ownership::Borrowed | Ownership::Owner(_) if stream.is_some() => {
            Err(MemoryError::OwnershipConflict {
                reason: "a deallocation stream needs a memory resource to free with",
            })
        }
        // SAFETY: the test keeps the memory allocated while the view is used.
        Ownership::Borrowed => Ok(Buffer::from_parts(
            unsafe { handles::raw::borrowed(ptr, size) },
            None,
        )),
        Ownership::Owner(owner) => Ok(Buffer::from_parts(
            // SAFETY: the test keeps the memory allocated while `owner` lives.
            unsafe { handles::raw::with_owner(ptr, size, owner)? },
            None,
        )),
    }
}

/// [`from_handle`] for managed memory ([`ManagedBuffer::adopt`], [`ManagedBuffer::from_parts`]).
pub fn managed_from_handle(
    ptr: CUdeviceptr,
    size: usize,
    ownership: Ownership,
    stream: Option<&StreamHandle>,
) -> Result<ManagedBuffer, MemoryError> {
    match ownership {
        Ownership::MemoryResource(mr) => {
            // SAFETY: as in `from_handle`.
            let allocation = unsafe { handles::raw::owned_allocation(ptr, size) };
            ManagedBuffer::adopt(allocation, mr, stream).map_err(given_back)
        }
        Ownership::Borrowed | Ownership::Owner(_) if stream.is_some() => {
            Err(MemoryError::OwnershipConflict {
                reason: "a deallocation stream needs a memory resource to free with",
            })
        }
        // SAFETY: the test keeps the managed memory allocated while the view is used.
        Ownership::Borrowed => Ok(ManagedBuffer::from_parts(
            unsafe { handles::raw::borrowed(ptr, size) },
            None,
        )),
        Ownership::Owner(owner) => Ok(ManagedBuffer::from_parts(
            // SAFETY: as for `Borrowed`, while `owner` lives.
            unsafe { handles::raw::with_owner(ptr, size, owner)? },
            None,
        )),
    }
}

/// A refused adoption's error; the allocation goes back to the test (its raw address).
fn given_back(refused: memory::AdoptError) -> MemoryError {
    let _ = refused.allocation.into_raw();
    refused.error
}
