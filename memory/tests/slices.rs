//! Typed views of a buffer (`DeviceSlice<T>`, `DeviceSliceMut<T>`): copies in and out through
//! `&[T]` and `Vec<T>`, sub-ranges, device-to-device copies between views (of one buffer or
//! two), fills, and the errors for a bad layout or range, found before any driver call; and a
//! memory resource of the caller's that builds its buffers from parts (`Buffer::from_parts`).
//! Runs on the emulator and on a real driver: the bytes read back and the pool's used memory
//! everywhere; the call log only on the emulator.

mod common;

use std::sync::Arc;

use common::*;
use handles::{OwnedAllocation, StreamHandle};
use memory::{
    Accessibility, Buffer, DeviceMemoryResource, MemoryError, MemoryResource, PinnedMemoryResource,
    PinnedMemoryResourceOptions,
};

fn device_mr() -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::new(0).expect("device 0's pool")
}

#[test]
fn copies_in_and_out_through_typed_slices() {
    let _serial = start();
    let s = stream_on(0);
    let base = device_used();
    let mut buffer = device_mr().allocate(8 * 4, &s).unwrap();
    let values: Vec<u32> = (10..18).collect();
    buffer
        .as_slice_mut::<u32>()
        .unwrap()
        .copy_from_slice(&values, &s)
        .unwrap();
    let all = buffer.as_slice::<u32>().unwrap();
    assert_eq!(all.len(), 8);
    assert_eq!(all.device_ptr(), buffer.ptr());
    assert_eq!(all.to_vec(&s).unwrap(), values);
    let middle = all.slice(2..5).unwrap();
    assert_eq!(middle.device_ptr(), buffer.ptr() + 8);
    assert_eq!(middle.to_vec(&s).unwrap(), [12, 13, 14]);
    assert_eq!(middle.slice(1..).unwrap().to_vec(&s).unwrap(), [13, 14]);
    let mut out = [0u32; 3];
    middle.copy_to_host(&mut out, &s).unwrap();
    assert_eq!(out, [12, 13, 14]);
    // The same bytes through the untyped API.
    assert_eq!(read(&buffer, &s), bytemuck_bytes(&values));
    buffer.close().unwrap();
    assert_eq!(device_used(), base, "freed");
    assert_no_hazards();
}

fn bytemuck_bytes(values: &[u32]) -> Vec<u8> {
    memory::bytemuck::cast_slice(values).to_vec()
}

#[test]
fn sub_ranges_are_written_in_place_and_views_copy_between_each_other() {
    let _serial = start();
    let s = stream_on(0);
    let mr = device_mr();
    let mut a = mr.allocate(6 * 2, &s).unwrap();
    let mut b = mr.allocate(6 * 2, &s).unwrap();
    a.as_slice_mut::<u16>().unwrap().fill(7, &s).unwrap();
    {
        let mut view = a.as_slice_mut::<u16>().unwrap();
        view.slice_mut(1..3)
            .unwrap()
            .copy_from_slice(&[100, 200], &s)
            .unwrap();
        // Two disjoint halves of one buffer: a copy between them.
        let (low, mut high) = view.split_at_mut(3).unwrap();
        high.copy_from(&low.as_slice(), &s).unwrap();
    }
    assert_eq!(
        a.as_slice::<u16>().unwrap().to_vec(&s).unwrap(),
        [7, 100, 200, 7, 100, 200]
    );
    // Between two buffers, from a sub-range into a sub-range.
    b.as_slice_mut::<u16>().unwrap().fill(0, &s).unwrap();
    let source = a.as_slice::<u16>().unwrap();
    b.as_slice_mut::<u16>()
        .unwrap()
        .slice_mut(4..)
        .unwrap()
        .copy_from(&source.slice(1..3).unwrap(), &s)
        .unwrap();
    assert_eq!(
        b.as_slice::<u16>().unwrap().to_vec(&s).unwrap(),
        [0, 0, 0, 0, 100, 200]
    );
    a.close().unwrap();
    b.close().unwrap();
    assert_no_hazards();
}

#[test]
fn bad_layouts_ranges_and_lengths_are_refused_before_any_driver_call() {
    let _serial = start();
    let s = stream_on(0);
    let mut buffer = device_mr().allocate(10, &s).unwrap();
    buffer.fill(0x11u8, &s).unwrap();
    s.synchronize().unwrap();
    let ptr = buffer.ptr();
    let from = mark();
    assert!(matches!(
        buffer.as_slice::<u32>(),
        Err(MemoryError::Layout {
            element_size: 4,
            ..
        })
    ));
    assert!(matches!(
        buffer.as_slice_mut::<u64>(),
        Err(MemoryError::Layout {
            element_size: 8,
            ..
        })
    ));
    {
        let bytes = buffer.as_slice::<u8>().unwrap();
        assert_eq!(
            bytes.slice(4..11).map(|_| ()),
            Err(MemoryError::OutOfRange {
                start: 4,
                end: 11,
                len: 10
            })
        );
        let mut short = [0u8; 3];
        assert_eq!(
            bytes.slice(..4).unwrap().copy_to_host(&mut short, &s),
            Err(MemoryError::SizeMismatch { src: 4, dst: 3 })
        );
    }
    let mut halves = buffer.as_slice_mut::<u16>().unwrap();
    assert_eq!(
        halves.split_at_mut(6).map(|_| ()),
        Err(MemoryError::OutOfRange {
            start: 0,
            end: 6,
            len: 5
        })
    );
    let (mut low, high) = halves.split_at_mut(2).unwrap();
    assert_eq!(
        low.copy_from(&high.as_slice(), &s),
        Err(MemoryError::SizeMismatch { src: 6, dst: 4 })
    );
    assert_eq!(
        low.copy_from_slice(&[1, 2, 3], &s),
        Err(MemoryError::SizeMismatch { src: 6, dst: 4 })
    );
    with_emulator(|emu| {
        assert!(
            emu.calls_for(emu.alloc_id(ptr), from).is_empty(),
            "no driver call touched the buffer"
        );
    });
    assert_eq!(read(&buffer, &s), vec![0x11; 10], "the bytes are unchanged");
    buffer.close().unwrap();
}

#[test]
fn typed_views_of_pinned_memory_work_on_any_device_stream() {
    let _serial = start();
    let s = stream_on(0);
    let mr = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let mut buffer = mr.allocate(4 * 4, &s).unwrap();
    let other = stream_on(
        if second_device_or_skip_part("a copy on device 1's stream") {
            1
        } else {
            0
        },
    );
    // The allocation is ordered on `s`, the copy on `other`, the read-back on `s` again: each
    // stream waits for the other's work first (without it the hazard checker reports the copy
    // as used before its allocation).
    s.synchronize().unwrap();
    buffer
        .as_slice_mut::<f32>()
        .unwrap()
        .copy_from_slice(&[1.5, -2.0, 0.25, 8.0], &other)
        .unwrap();
    other.synchronize().unwrap();
    assert_eq!(
        buffer.as_slice::<f32>().unwrap().to_vec(&s).unwrap(),
        [1.5, -2.0, 0.25, 8.0]
    );
    buffer.close().unwrap();
    assert_no_hazards();
}

/// A memory resource of the caller's that hands out memory of an inner pool resource under
/// its own name: `allocate` builds each buffer from the inner buffer's handle and itself
/// (`Buffer::from_parts`), with no pointer taken out of custody's ownership.
struct Renamed {
    inner: Arc<DeviceMemoryResource>,
}

impl MemoryResource for Renamed {
    fn allocate_owned(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        let inner = self.inner.allocate(size, stream)?;
        Ok(Buffer::from_parts(inner.handle().clone(), Some(self)))
    }

    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        self.inner.deallocate(allocation, stream)
    }

    fn accessibility(&self) -> Accessibility {
        Accessibility::device(0)
    }
}

#[test]
fn a_resource_of_the_callers_builds_buffers_from_parts() {
    let _serial = start();
    let s = stream_on(0);
    let base = device_used();
    let mr: Arc<dyn MemoryResource> = Arc::new(Renamed { inner: device_mr() });
    let buffer = Arc::clone(&mr).allocate_owned(256, &s).unwrap();
    let alloc = alloc_of(buffer.ptr());
    assert!(Arc::ptr_eq(buffer.memory_resource().unwrap(), &mr));
    assert_eq!(buffer.is_device_accessible(), Ok(true));
    assert_eq!(buffer.device_id(), Ok(Some(0)));
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s));
    buffer.fill(3u8, &s).unwrap();
    assert_eq!(read(&buffer, &s), vec![3; 256]);
    assert!(
        device_used() >= base + 256,
        "the inner buffer's drop freed nothing"
    );
    let from = mark();
    buffer.close().unwrap();
    assert_eq!(device_used(), base, "freed by the handle's own rule");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(free.stream, Some(s.raw() as u64));
    });
    assert_no_hazards();
}

/// The exclusivity of `DeviceSliceMut` is that of a borrow of one `Buffer` value (ARCHITECTURE.md,
/// `memory/src/slice.rs`): a second buffer over a clone of the handle lends its own mutable view
/// at the same time, and both write the same memory. The memory goes when the last owner does.
#[test]
fn mutable_views_are_exclusive_per_buffer_not_per_memory() {
    let _serial = start();
    let s = stream_on(0);
    let base = device_used();
    let mut buffer = device_mr().allocate(8 * 2, &s).unwrap();
    let mut alias = Buffer::from_parts(buffer.handle().clone(), None);
    assert_eq!(alias.ptr(), buffer.ptr());
    {
        let mut mine = buffer.as_slice_mut::<u64>().unwrap();
        let mut theirs = alias.as_slice_mut::<u64>().unwrap();
        theirs.copy_from_slice(&[7, 7], &s).unwrap();
        mine.slice_mut(..1)
            .unwrap()
            .copy_from_slice(&[8], &s)
            .unwrap();
        assert_eq!(mine.device_ptr(), theirs.device_ptr(), "one memory");
    }
    assert_eq!(alias.as_slice::<u64>().unwrap().to_vec(&s).unwrap(), [8, 7]);
    buffer.close().unwrap();
    assert_eq!(
        alias.as_slice::<u64>().unwrap().to_vec(&s).unwrap(),
        [8, 7],
        "the alias keeps the memory alive"
    );
    alias.close().unwrap();
    assert_eq!(device_used(), base, "freed by the last owner");
    assert_no_hazards();
}

#[test]
fn views_check_the_element_layout_without_a_driver() {
    // SAFETY: a made-up address; nothing is ever copied to or from it (only layouts and
    // ranges are checked, with no driver call).
    let handle = unsafe { handles::raw::borrowed(0x1002, 6) };
    let view = Buffer::from_parts(handle, None);
    assert_eq!(view.as_slice::<u16>().map(|s| s.len()).ok(), Some(3));
    assert!(matches!(
        view.as_slice::<u32>(),
        Err(MemoryError::Layout {
            element_size: 4,
            ..
        })
    ));
    assert!(matches!(
        view.as_slice::<()>(),
        Err(MemoryError::Layout {
            element_size: 0,
            ..
        })
    ));
    let bytes = view.as_slice::<u8>().unwrap();
    let part = bytes.slice(2..5).unwrap();
    assert_eq!((part.device_ptr(), part.len()), (0x1004, 3));
}

#[test]
fn views_need_no_driver() {
    // SAFETY: a made-up address that nothing copies to or from.
    let view = Buffer::from_parts(unsafe { handles::raw::borrowed(0x1000, 64) }, None);
    assert_eq!((view.ptr(), view.size()), (0x1000, 64));
    assert!(view.memory_resource().is_none());
    assert_eq!(view.deallocation_stream().map(|_| ()), None);
    // A view frees nothing: setting a stream records nothing, closing calls no driver.
    view.set_deallocation_stream(&StreamHandle::legacy())
        .unwrap();
    assert_eq!(view.deallocation_stream().map(|_| ()), None);
    view.close().unwrap();
}
