//! Managed-memory placement: advice (`cuMemAdvise_v2`), prefetch (`cuMemPrefetchAsync_v2`, the
//! batch forms `cuMemPrefetchBatchAsync`, `cuMemDiscardBatchAsync`,
//! `cuMemDiscardAndPrefetchBatchAsync`) and what the driver reports for a range
//! (`cuMemRangeGetAttribute`), over [`DeviceRange`]s of managed memory.
//!
//! Locations travel as [`RawMemLocation`] (plain integers): the CUDA 12.0 types have no host,
//! host-NUMA or current-NUMA location values.

use std::ffi::{c_int, c_uint, c_void};

use cuda_sys::types::{CUdeviceptr, RawMemLocation};

use crate::context::{in_context, ContextHandle};
use crate::error::HandleError;
use crate::range::DeviceRange;
use crate::stream::StreamHandle;
use crate::sys::{check, driver};

/// `CU_MEM_LOCATION_TYPE_DEVICE`, `_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`.
const LOCATION_DEVICE: c_uint = 1;
const LOCATION_HOST: c_uint = 2;
const LOCATION_HOST_NUMA: c_uint = 3;
const LOCATION_HOST_NUMA_CURRENT: c_uint = 4;

/// `CU_DEVICE_CPU`: the host, where the range attributes name a device.
const DEVICE_CPU: c_int = -1;

/// Where managed memory is placed, advised to live or read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemLocation {
    /// Device `ordinal` (`CU_MEM_LOCATION_TYPE_DEVICE`).
    Device(i32),
    /// The host, any NUMA node (`CU_MEM_LOCATION_TYPE_HOST`).
    Host,
    /// Host NUMA node `node` (`CU_MEM_LOCATION_TYPE_HOST_NUMA`).
    HostNuma(i32),
    /// The NUMA node of the calling thread (`CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT`).
    HostNumaCurrent,
}

impl MemLocation {
    fn raw(self) -> RawMemLocation {
        let (type_, id) = match self {
            MemLocation::Device(ordinal) => (LOCATION_DEVICE, ordinal),
            MemLocation::Host => (LOCATION_HOST, 0),
            MemLocation::HostNuma(node) => (LOCATION_HOST_NUMA, node),
            MemLocation::HostNumaCurrent => (LOCATION_HOST_NUMA_CURRENT, 0),
        };
        RawMemLocation { type_, id }
    }

    /// The location a `(type, id)` pair of the range attributes names; `None` for no location
    /// (type 0, `CU_MEM_LOCATION_TYPE_INVALID`) or a type this build does not know.
    fn from_raw(type_: c_int, id: c_int) -> Option<MemLocation> {
        match type_ as c_uint {
            LOCATION_DEVICE => Some(MemLocation::Device(id)),
            LOCATION_HOST => Some(MemLocation::Host),
            LOCATION_HOST_NUMA => Some(MemLocation::HostNuma(id)),
            LOCATION_HOST_NUMA_CURRENT => Some(MemLocation::HostNumaCurrent),
            _ => None,
        }
    }

    /// The location a device id of the range attributes names (`CU_DEVICE_CPU` the host; other
    /// negative values, `CU_DEVICE_INVALID`, none).
    fn from_device_id(id: c_int) -> Option<MemLocation> {
        match id {
            DEVICE_CPU => Some(MemLocation::Host),
            id if id >= 0 => Some(MemLocation::Device(id)),
            _ => None,
        }
    }
}

/// Advice for a managed range (`CUmem_advise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemAdvice {
    /// `CU_MEM_ADVISE_SET_READ_MOSTLY`: reads may be served from read-only copies.
    SetReadMostly,
    /// `CU_MEM_ADVISE_UNSET_READ_MOSTLY`.
    UnsetReadMostly,
    /// `CU_MEM_ADVISE_SET_PREFERRED_LOCATION`: where the pages should live.
    SetPreferredLocation(MemLocation),
    /// `CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION`.
    UnsetPreferredLocation,
    /// `CU_MEM_ADVISE_SET_ACCESSED_BY`: keep the pages mapped for that location.
    SetAccessedBy(MemLocation),
    /// `CU_MEM_ADVISE_UNSET_ACCESSED_BY`.
    UnsetAccessedBy(MemLocation),
}

impl MemAdvice {
    fn raw(self) -> (c_uint, RawMemLocation) {
        // The location is not read for the advice kinds that name none.
        let none = MemLocation::Host.raw();
        match self {
            MemAdvice::SetReadMostly => (1, none),
            MemAdvice::UnsetReadMostly => (2, none),
            MemAdvice::SetPreferredLocation(l) => (3, l.raw()),
            MemAdvice::UnsetPreferredLocation => (4, none),
            MemAdvice::SetAccessedBy(l) => (5, l.raw()),
            MemAdvice::UnsetAccessedBy(l) => (6, l.raw()),
        }
    }
}

/// What `cuMemRangeGetAttribute` reports of a range (`CU_MEM_RANGE_ATTRIBUTE_*`).
#[derive(Clone, Copy)]
#[repr(u32)]
enum RangeAttribute {
    ReadMostly = 1,
    PreferredLocation = 2,
    AccessedBy = 3,
    LastPrefetchLocation = 4,
    PreferredLocationType = 5,
    PreferredLocationId = 6,
    LastPrefetchLocationType = 7,
    LastPrefetchLocationId = 8,
}

/// Drivers from CUDA 12.2 on report locations by type and id (the `_TYPE`/`_ID` attributes).
const TYPED_LOCATIONS: i32 = 12020;

impl DeviceRange<'_> {
    /// The context advice and range queries run in: a real driver refuses
    /// `cuMemRangeGetAttribute` with no context current (`CUDA_ERROR_INVALID_CONTEXT`,
    /// `docs/driver-facts.md` F23). The recipe's context for memory that has one, else the
    /// primary context of the memory's device (device 0 for memory of no device).
    fn placement_context(&self) -> Result<ContextHandle, HandleError> {
        match self.handle().recipe() {
            Some(recipe) => Ok(recipe.context().clone()),
            None => ContextHandle::primary(self.handle().device().unwrap_or(0)),
        }
    }

    /// Gives the driver `advice` for this range of managed memory. Not ordered on any stream;
    /// does not block.
    ///
    /// # Errors
    /// [`HandleError::Load`] when the driver lacks `cuMemAdvise_v2` (before CUDA 12.2);
    /// [`HandleError::Driver`] when it refuses (memory that is not managed, a location the
    /// advice does not take: `CUDA_ERROR_INVALID_VALUE`, `CUDA_ERROR_INVALID_DEVICE`).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed: the memory's context),
    /// `cuMemAdvise_v2`; none for zero bytes (`Ok`: nothing to advise).
    pub fn advise(&self, advice: MemAdvice) -> Result<(), HandleError> {
        let advise = driver()?.cuMemAdvise_v2().map_err(HandleError::Load)?;
        let (kind, location) = advice.raw();
        let (ptr, len) = (self.ptr(), self.len());
        if len == 0 {
            return Ok(());
        }
        in_context(&self.placement_context()?, "cuMemAdvise_v2", |_| {
            // SAFETY: the range lies inside memory its borrowed handle keeps alive; plain values.
            let status = unsafe { advise(ptr, len, kind, location) };
            check("cuMemAdvise_v2", status)
        })
    }

    /// Migrates this range of managed memory to `location`, ordered on `stream`. Does not
    /// block.
    ///
    /// # Errors
    /// [`HandleError::Load`] when the driver lacks `cuMemPrefetchAsync_v2` (before CUDA 12.2);
    /// [`HandleError::Driver`] when it refuses (memory that is not managed, a bad location).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemPrefetchAsync_v2`;
    /// none for zero bytes (`Ok`: nothing to migrate).
    pub fn prefetch(
        &self,
        location: MemLocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        let prefetch = driver()?
            .cuMemPrefetchAsync_v2()
            .map_err(HandleError::Load)?;
        let (ptr, len, location) = (self.ptr(), self.len(), location.raw());
        if len == 0 {
            return Ok(());
        }
        stream.run("cuMemPrefetchAsync_v2", |_, s| {
            // SAFETY: the range lies inside memory its borrowed handle keeps alive; the stream
            // is alive and its context current.
            unsafe { prefetch(ptr, len, location, 0, s) }
        })
    }

    /// One 32-bit range attribute.
    fn range_attribute(&self, attribute: RangeAttribute) -> Result<c_int, HandleError> {
        let get = driver()?
            .cuMemRangeGetAttribute()
            .map_err(HandleError::Load)?;
        let (ptr, len) = (self.ptr(), self.len());
        in_context(&self.placement_context()?, "cuMemRangeGetAttribute", |_| {
            let mut value: c_int = 0;
            // SAFETY: `value` is 4 writable bytes; the range lies inside memory its borrowed
            // handle keeps alive.
            let status = unsafe {
                get(
                    (&mut value as *mut c_int).cast::<c_void>(),
                    std::mem::size_of::<c_int>(),
                    attribute as c_uint,
                    ptr,
                    len,
                )
            };
            check("cuMemRangeGetAttribute", status)?;
            Ok(value)
        })
    }

    /// A location the driver reports as a `(type, id)` pair (CUDA 12.2 on) or else as a device
    /// id.
    fn location_attribute(
        &self,
        typed: (RangeAttribute, RangeAttribute),
        by_device: RangeAttribute,
    ) -> Result<Option<MemLocation>, HandleError> {
        if driver()?.version() >= TYPED_LOCATIONS {
            let type_ = self.range_attribute(typed.0)?;
            let id = self.range_attribute(typed.1)?;
            Ok(MemLocation::from_raw(type_, id))
        } else {
            Ok(MemLocation::from_device_id(
                self.range_attribute(by_device)?,
            ))
        }
    }

    /// Whether read-mostly advice is set for the whole range.
    ///
    /// # Errors
    /// [`HandleError::Load`] when the driver lacks `cuMemRangeGetAttribute`;
    /// [`HandleError::Driver`] when it refuses (memory that is not managed).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed: the memory's context),
    /// `cuMemRangeGetAttribute`.
    pub fn read_mostly(&self) -> Result<bool, HandleError> {
        Ok(self.range_attribute(RangeAttribute::ReadMostly)? != 0)
    }

    /// The preferred location advised for the whole range; `None` when none is (or the range's
    /// parts differ).
    ///
    /// # Errors
    /// As [`DeviceRange::read_mostly`].
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemRangeGetAttribute` (twice on CUDA 12.2 and later: the location's
    /// type and id).
    pub fn preferred_location(&self) -> Result<Option<MemLocation>, HandleError> {
        self.location_attribute(
            (
                RangeAttribute::PreferredLocationType,
                RangeAttribute::PreferredLocationId,
            ),
            RangeAttribute::PreferredLocation,
        )
    }

    /// Where the range was last prefetched to; `None` when it never was (or its parts differ).
    ///
    /// # Errors
    /// As [`DeviceRange::read_mostly`].
    ///
    /// Driver calls: as [`DeviceRange::preferred_location`].
    pub fn last_prefetch_location(&self) -> Result<Option<MemLocation>, HandleError> {
        self.location_attribute(
            (
                RangeAttribute::LastPrefetchLocationType,
                RangeAttribute::LastPrefetchLocationId,
            ),
            RangeAttribute::LastPrefetchLocation,
        )
    }

    /// The locations accessed-by advice is set for, for the whole range: devices and the host
    /// (the attribute names no NUMA node).
    ///
    /// # Errors
    /// As [`DeviceRange::read_mostly`].
    ///
    /// Driver calls: `cuDeviceGetCount`, `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed: the
    /// memory's context), `cuMemRangeGetAttribute`.
    pub fn accessed_by(&self) -> Result<Vec<MemLocation>, HandleError> {
        let get = driver()?
            .cuMemRangeGetAttribute()
            .map_err(HandleError::Load)?;
        // Every device and the host: one slot each.
        let slots = crate::device::device_count()?.max(0) as usize + 1;
        let mut ids: Vec<c_int> = vec![-2; slots];
        let (ptr, len) = (self.ptr(), self.len());
        in_context(&self.placement_context()?, "cuMemRangeGetAttribute", |_| {
            // SAFETY: `ids` is `slots` writable 32-bit values; the range lies inside memory its
            // borrowed handle keeps alive.
            let status = unsafe {
                get(
                    ids.as_mut_ptr().cast::<c_void>(),
                    slots * std::mem::size_of::<c_int>(),
                    RangeAttribute::AccessedBy as c_uint,
                    ptr,
                    len,
                )
            };
            check("cuMemRangeGetAttribute", status)
        })?;
        Ok(ids
            .into_iter()
            .filter_map(MemLocation::from_device_id)
            .collect())
    }
}

/// The arrays the batch calls take: addresses, sizes, and the locations with the index of the
/// first range each applies to (one entry per run of equal locations).
struct Batch {
    ptrs: Vec<CUdeviceptr>,
    sizes: Vec<usize>,
    locations: Vec<RawMemLocation>,
    first: Vec<usize>,
}

/// Ranges of zero bytes are checked with the others and then left out (with their locations):
/// no driver's answer to a zero-length entry is relied on, and a batch of only empty ranges makes
/// no call ([`Batch::is_empty`]).
fn batch(ranges: &[DeviceRange<'_>], locations: &[MemLocation]) -> Result<Batch, HandleError> {
    if ranges.is_empty() {
        return Err(HandleError::invalid("ranges", "no ranges given"));
    }
    let kept: Vec<usize> = (0..ranges.len())
        .filter(|&i| !ranges[i].is_empty())
        .collect();
    let mut out = Batch {
        ptrs: kept.iter().map(|&i| ranges[i].ptr()).collect(),
        sizes: kept.iter().map(|&i| ranges[i].len()).collect(),
        locations: Vec::new(),
        first: Vec::new(),
    };
    if locations.is_empty() {
        return Ok(out);
    }
    if locations.len() != ranges.len() {
        return Err(HandleError::invalid(
            "locations",
            format!(
                "{} locations for {} ranges (give one per range)",
                locations.len(),
                ranges.len()
            ),
        ));
    }
    for (at, &i) in kept.iter().enumerate() {
        if at == 0 || locations[kept[at - 1]] != locations[i] {
            out.locations.push(locations[i].raw());
            out.first.push(at);
        }
    }
    Ok(out)
}

impl Batch {
    /// Whether every range was empty: the batch then makes no driver call.
    fn is_empty(&self) -> bool {
        self.ptrs.is_empty()
    }
}

/// Migrates each range to its location (`locations[i]` for `ranges[i]`), ordered on `stream`,
/// in one driver call. Does not block.
///
/// # Errors
/// [`HandleError::InvalidArgument`] for no ranges or not one location per range (before any
/// driver call); [`HandleError::Load`] when the driver lacks `cuMemPrefetchBatchAsync` (before
/// CUDA 12.8); [`HandleError::Driver`] when it refuses (memory that is not managed).
///
/// Ranges of zero bytes are left out of the call, and a batch of only empty ranges makes none.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemPrefetchBatchAsync`.
pub fn prefetch_batch(
    ranges: &[DeviceRange<'_>],
    locations: &[MemLocation],
    stream: &StreamHandle,
) -> Result<(), HandleError> {
    located_batch(
        "cuMemPrefetchBatchAsync",
        driver()?.cuMemPrefetchBatchAsync(),
        ranges,
        locations,
        stream,
    )
}

/// The batch calls that take ranges and their locations (`cuMemPrefetchBatchAsync`,
/// `cuMemDiscardAndPrefetchBatchAsync`, which share a signature), with no flags, ordered on
/// `stream`.
fn located_batch(
    name: &'static str,
    call: Result<cuda_sys::fn_types::cuMemPrefetchBatchAsync, cuda_sys::LoadError>,
    ranges: &[DeviceRange<'_>],
    locations: &[MemLocation],
    stream: &StreamHandle,
) -> Result<(), HandleError> {
    if locations.is_empty() {
        return Err(HandleError::invalid("locations", "no locations given"));
    }
    let b = batch(ranges, locations)?;
    let call = call.map_err(HandleError::Load)?;
    if b.is_empty() {
        return Ok(());
    }
    stream.run(name, |_, s| {
        // SAFETY: the arrays hold `count` and `numPrefetchLocs` items and outlive the call; the
        // ranges lie inside memory their borrowed handles keep alive; the stream is alive and
        // its context current.
        unsafe {
            call(
                b.ptrs.as_ptr(),
                b.sizes.as_ptr(),
                b.ptrs.len(),
                b.locations.as_ptr(),
                b.first.as_ptr(),
                b.locations.len(),
                0,
                s,
            )
        }
    })
}

/// Tells the driver the ranges' contents are no longer needed (they read as undefined until
/// written), ordered on `stream`, in one driver call. Does not block.
///
/// # Errors
/// [`HandleError::InvalidArgument`] for no ranges (before any driver call);
/// [`HandleError::Load`] when the driver lacks `cuMemDiscardBatchAsync` (before CUDA 12.8);
/// [`HandleError::Driver`] when it refuses (memory that is not managed).
///
/// Ranges of zero bytes are left out of the call, and a batch of only empty ranges makes none.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemDiscardBatchAsync`.
pub fn discard_batch(ranges: &[DeviceRange<'_>], stream: &StreamHandle) -> Result<(), HandleError> {
    let b = batch(ranges, &[])?;
    let call = driver()?
        .cuMemDiscardBatchAsync()
        .map_err(HandleError::Load)?;
    if b.is_empty() {
        return Ok(());
    }
    stream.run("cuMemDiscardBatchAsync", |_, s| {
        // SAFETY: the arrays hold `count` items and outlive the call; the ranges lie inside
        // memory their borrowed handles keep alive; the stream is alive and its context current.
        unsafe { call(b.ptrs.as_ptr(), b.sizes.as_ptr(), b.ptrs.len(), 0, s) }
    })
}

/// Discards the ranges' contents and migrates each to its location (`locations[i]` for
/// `ranges[i]`), ordered on `stream`, in one driver call. Does not block.
///
/// # Errors
/// As [`prefetch_batch`], for `cuMemDiscardAndPrefetchBatchAsync`.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
/// `cuMemDiscardAndPrefetchBatchAsync`.
pub fn discard_prefetch_batch(
    ranges: &[DeviceRange<'_>],
    locations: &[MemLocation],
    stream: &StreamHandle,
) -> Result<(), HandleError> {
    located_batch(
        "cuMemDiscardAndPrefetchBatchAsync",
        driver()?.cuMemDiscardAndPrefetchBatchAsync(),
        ranges,
        locations,
        stream,
    )
}
