//! Checked byte ranges ([`DeviceRange`]), the only way safe code reads or writes memory through
//! custody: bounds, copies between ranges and to and from host slices, fills
//! of 8, 16 and 32 bits, and the bad inputs refused before any driver call.

mod common;

use common::*;
use handles::{
    ContextHandle, DevicePtrHandle, DeviceRange, HandleError, StreamFlags, StreamHandle,
};

fn device_buffer(size: usize, stream: &StreamHandle) -> DevicePtrHandle {
    DevicePtrHandle::alloc_from_pool(size, &default_pool(), stream).expect("pool allocation")
}

fn read(range: DeviceRange<'_>, stream: &StreamHandle) -> Vec<u8> {
    let mut out = vec![0u8; range.len()];
    range.copy_to_host(&mut out, stream).expect("copy to host");
    out
}

#[test]
fn ranges_are_checked_against_the_handle_size() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = device_buffer(64, &stream);
    let whole = buffer.as_range();
    assert_eq!(
        (whole.offset(), whole.len(), whole.ptr()),
        (0, 64, buffer.ptr())
    );
    let middle = buffer.range(16, 32).unwrap();
    assert_eq!(middle.ptr(), buffer.ptr() + 16);
    assert!(middle.handle().ptr_eq(&buffer));
    let inner = middle.subrange(8, 8).unwrap();
    assert_eq!((inner.offset(), inner.len()), (24, 8));
    assert!(
        buffer.range(64, 0).unwrap().is_empty(),
        "an empty range at the end"
    );

    let me = tid();
    let from = mark();
    for (offset, len) in [(0, 65), (65, 0), (60, 8), (usize::MAX, 2), (1, usize::MAX)] {
        let error = buffer.range(offset, len).unwrap_err();
        assert!(
            matches!(error, HandleError::InvalidArgument { what: "range", .. }),
            "{offset}+{len}: {error:?}"
        );
    }
    assert!(
        middle.subrange(30, 4).is_err(),
        "past the end of the subrange"
    );
    assert!(middle.subrange(0, 32).is_ok());
    with_emulator(|emu| assert!(emu.names_on(me, from).is_empty(), "no driver call"));
    buffer.release().unwrap();
}

#[test]
fn host_round_trip_and_device_copies_move_exactly_the_range() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let src = device_buffer(64, &stream);
    let dst = device_buffer(64, &stream);
    let pattern: Vec<u8> = (0..64).collect();
    src.as_range().copy_from_host(&pattern, &stream).unwrap();
    dst.as_range().fill_u8(0xee, &stream).unwrap();
    // Bytes 8..24 of src land at 32..48 of dst; nothing else of dst changes.
    src.range(8, 16)
        .unwrap()
        .copy_to(&dst.range(32, 16).unwrap(), &stream)
        .unwrap();
    let back = read(dst.as_range(), &stream);
    let mut expected = vec![0xee_u8; 64];
    expected[32..48].copy_from_slice(&pattern[8..24]);
    assert_eq!(back, expected);
    assert_eq!(read(src.range(60, 4).unwrap(), &stream), [60, 61, 62, 63]);
    assert_eq!(current_raw(), 0, "the caller's binding is unchanged");
    drop((src, dst));
    assert_no_hazards();
}

#[test]
fn fills_of_every_width_cover_only_the_range() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = device_buffer(32, &stream);
    buffer.as_range().fill_u8(0, &stream).unwrap();
    buffer
        .range(4, 4)
        .unwrap()
        .fill_u16(0xa1b2, &stream)
        .unwrap();
    buffer
        .range(8, 8)
        .unwrap()
        .fill_u32(0x0102_0304, &stream)
        .unwrap();
    let bytes = read(buffer.as_range(), &stream);
    let mut expected = vec![0u8; 32];
    expected[4..8].copy_from_slice(&[0xa1b2_u16.to_ne_bytes(), 0xa1b2_u16.to_ne_bytes()].concat());
    for chunk in expected[8..16].chunks_mut(4) {
        chunk.copy_from_slice(&0x0102_0304_u32.to_ne_bytes());
    }
    assert_eq!(bytes, expected);
    drop(buffer);
    assert_no_hazards();
}

#[test]
fn bad_lengths_and_alignments_are_refused_before_any_driver_call() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = device_buffer(64, &stream);
    let other = device_buffer(64, &stream);
    let me = tid();
    let from = mark();
    let refused = [
        buffer
            .range(0, 8)
            .unwrap()
            .copy_to(&other.range(0, 16).unwrap(), &stream),
        buffer
            .range(0, 8)
            .unwrap()
            .copy_to_host(&mut [0u8; 4], &stream),
        buffer
            .range(0, 8)
            .unwrap()
            .copy_from_host(&[0u8; 9], &stream),
        buffer.range(0, 3).unwrap().fill_u16(1, &stream),
        buffer.range(1, 4).unwrap().fill_u16(1, &stream),
        buffer.range(0, 6).unwrap().fill_u32(1, &stream),
        buffer.range(2, 4).unwrap().fill_u32(1, &stream),
    ];
    for (i, result) in refused.into_iter().enumerate() {
        let error = result.unwrap_err();
        assert!(
            matches!(error, HandleError::InvalidArgument { .. }),
            "case {i}: {error:?}"
        );
    }
    with_emulator(|emu| assert!(emu.names_on(me, from).is_empty(), "no driver call"));
    drop((buffer, other));
}

#[test]
fn an_unbound_token_needs_a_current_context() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = device_buffer(16, &stream);
    let legacy = StreamHandle::legacy();
    let error = buffer.as_range().fill_u8(1, &legacy).unwrap_err();
    assert_eq!(error, HandleError::NoCurrentContext);
    a.make_current().unwrap();
    buffer.as_range().fill_u8(7, &legacy).unwrap();
    assert_eq!(read(buffer.as_range(), &legacy), [7; 16]);
    ContextHandle::clear_current().unwrap();
    drop(buffer);
}
