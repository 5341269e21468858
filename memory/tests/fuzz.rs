//! Hostile input, Rust side: property-based tests (proptest) of IPC descriptor parsing
//! and of the public buffer and resource API. Whatever the input: only documented errors
//! (`MemoryError`'s variants as each function lists them), no panic, no leak: after every case
//! nothing it allocated is still allocated (the emulator's live allocations, when it is the
//! driver; every pool's `USED_MEM_CURRENT` everywhere), and adopted memory that was refused was
//! never handed to `deallocate`.
//!
//! Runs on the emulator and on a GPU. Cases per property: 64 for the properties that make no
//! driver call (descriptor and fill-pattern parsing), everywhere; for those that call the driver
//! (adoption, allocation, operations on buffers), 64 on the emulator, where a case costs about a
//! millisecond, and [`REAL_DRIVER_CASES`] on a real driver, where a case's cost is its synchronous
//! driver calls (a pinned pool made and destroyed, pinned and managed allocations of up to 1 TiB
//! asked for, context synchronisations), taken under a lock the driver shares with every process
//! on the GPU: 64 cases ran past the GPU runner's 120 s beside seven other test processes on the
//! H200, so a real-driver run does a fifth of them in the same shapes, and each property's time
//! there grows linearly with its cases. `CUSTODY_FUZZ_CASES` sets the cases of every property on
//! any driver (a longer run by hand); `PROPTEST_RNG_SEED` fixes the generator's seed (the default
//! is random; a failure prints the minimal failing input). The run prints the count it uses.

mod adopt;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use adopt::Ownership;
use handles::PoolAttribute;
use handles::{ContextHandle, HandleError, OwnedAllocation, StreamFlags, StreamHandle};
use memory::{
    Accessibility, Buffer, DeviceMemoryResource, FillValue, IpcBufferDescriptor,
    LegacyPinnedMemoryResource, ManagedMemoryResource, MemoryError, MemoryResource,
    PinnedMemoryResource, PinnedMemoryResourceOptions, PoolMemoryResource,
    SynchronousMemoryResource,
};
use proptest::prelude::*;
use test_support::emu::{AllocationId, Emulator};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // Before anything that could hang: the GPU runner asks a hung test for its stacks.
    test_support::stacks::dump_stacks_on_signal();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Cases per property on the emulator, and for the properties that make no driver call.
const CASES: u32 = 64;

/// Cases per driver-calling property on a real driver (see the file's documentation).
const REAL_DRIVER_CASES: u32 = 12;

/// `CUSTODY_FUZZ_CASES`, when set.
fn cases_from_environment() -> Option<u32> {
    std::env::var("CUSTODY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
}

fn with_cases(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Shrunk failures are printed; nothing is written next to the sources.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// For the properties that make no driver call.
fn config() -> ProptestConfig {
    with_cases(cases_from_environment().unwrap_or(CASES))
}

/// For the properties that call the driver: [`CASES`] on the emulator, [`REAL_DRIVER_CASES`]
/// on a real driver (and on the emulator pretending to be one), unless `CUSTODY_FUZZ_CASES` says.
fn driver_config() -> ProptestConfig {
    let cases = cases_from_environment().unwrap_or(if emulator().is_some() {
        CASES
    } else {
        REAL_DRIVER_CASES
    });
    eprintln!("fuzz: {cases} cases per driver-calling property");
    with_cases(cases)
}

fn emulator() -> Option<Emulator> {
    let pretend = std::env::var_os("CUSTODY_TEST_PRETEND_REAL_DRIVER").is_some_and(|v| v != "0");
    Emulator::get().filter(|_| !pretend)
}

fn primary() -> ContextHandle {
    ContextHandle::primary(0).expect("device 0")
}

fn stream() -> StreamHandle {
    StreamHandle::create(&primary(), StreamFlags::DEFAULT, 0).expect("stream")
}

/// What must be back where it was after a case: the emulator's live allocations and the
/// device's current pool's used memory.
struct Baseline {
    live: HashSet<AllocationId>,
    used: u64,
    pool: DeviceMemoryResource,
}

fn used_now(mr: &DeviceMemoryResource) -> u64 {
    primary().synchronize().expect("cuCtxSynchronize");
    mr.pool()
        .attribute(PoolAttribute::USED_MEM_CURRENT)
        .expect("USED_MEM_CURRENT")
}

impl Baseline {
    fn take() -> Baseline {
        handles::drain_deferred_cleanup();
        let pool = Arc::try_unwrap(DeviceMemoryResource::new(0).expect("pool"))
            .unwrap_or_else(|_| unreachable!("a new resource has one owner"));
        Baseline {
            live: emulator().map_or_else(HashSet::new, |emu| {
                emu.live_allocations().iter().map(|a| a.id).collect()
            }),
            used: used_now(&pool),
            pool,
        }
    }

    /// Fails the case (no panic: proptest shrinks it) when something leaked.
    fn check(&self) -> Result<(), TestCaseError> {
        loop {
            handles::drain_deferred_cleanup();
            if handles::deferred_cleanup_pending() == 0 {
                break;
            }
        }
        prop_assert_eq!(used_now(&self.pool), self.used, "device pool used memory");
        if let Some(emu) = emulator() {
            let leaked: Vec<u64> = emu
                .live_allocations()
                .iter()
                .filter(|a| !self.live.contains(&a.id))
                .map(|a| a.ptr)
                .collect();
            prop_assert!(leaked.is_empty(), "still allocated: {:x?}", leaked);
            let hazards = emu.hazards();
            prop_assert!(hazards.is_empty(), "hazards: {:?}", hazards);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// IPC descriptors: bytes from another process are untrusted.

fn valid_descriptor_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        -1i32..8,
        1u64..(1 << 40),
        proptest::collection::vec(any::<u8>(), 64),
    )
        .prop_map(|(device, size, export)| {
            let mut out = Vec::with_capacity(IpcBufferDescriptor::LEN);
            out.extend_from_slice(b"CUSTDIPC");
            out.extend_from_slice(&1u32.to_le_bytes());
            out.extend_from_slice(&1u32.to_le_bytes());
            out.extend_from_slice(&device.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&export);
            out
        })
}

/// Parses, and checks that a parse is either one of the documented errors or a descriptor that
/// serialises back to exactly the bytes it came from.
fn parse_checked(bytes: &[u8]) -> Result<(), TestCaseError> {
    match IpcBufferDescriptor::from_bytes(bytes) {
        Ok(descriptor) => {
            prop_assert_eq!(bytes.len(), IpcBufferDescriptor::LEN);
            prop_assert_eq!(&descriptor.to_bytes()[..], bytes);
            prop_assert!(descriptor.size() > 0 && descriptor.size() <= isize::MAX as usize);
            prop_assert!(descriptor.device_id().into_iter().all(|d| d >= 0));
        }
        Err(MemoryError::Ipc(reason)) => {
            let reason = reason.to_string();
            prop_assert!(!reason.is_empty() && !reason.ends_with('.'));
        }
        Err(MemoryError::InvalidSize { .. }) => {}
        Err(other) => prop_assert!(false, "undocumented error {other:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn descriptor_parsing_of_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        parse_checked(&bytes)?;
    }

    #[test]
    fn descriptor_parsing_of_corrupted_descriptors(
        good in valid_descriptor_bytes(),
        flips in proptest::collection::vec((0usize..96, any::<u8>()), 0..6),
        cut in 0usize..100,
    ) {
        parse_checked(&good)?;
        let back = IpcBufferDescriptor::from_bytes(&good).expect("a well-formed descriptor");
        prop_assert_eq!(&back.to_bytes()[..], &good[..]);
        let mut bad = good.clone();
        for (at, value) in flips {
            bad[at] = value;
        }
        parse_checked(&bad)?;
        bad.truncate(cut.min(bad.len()));
        parse_checked(&bad)?;
    }

    #[test]
    fn fill_patterns_from_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..9)) {
        match FillValue::from_bytes(&bytes) {
            Ok(value) => prop_assert_eq!(value.width(), bytes.len()),
            Err(MemoryError::InvalidFill { width, .. }) => {
                prop_assert_eq!(width, bytes.len());
                prop_assert!(![1, 2, 4].contains(&bytes.len()));
            }
            Err(other) => prop_assert!(false, "undocumented error {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Adoption: `Buffer::from_handle` with any pointer, size, ownership and stream.

/// A memory resource that frees nothing: it records what `deallocate` was asked to free.
struct Ledger {
    deallocated: Mutex<Vec<(u64, usize)>>,
}

impl MemoryResource for Ledger {
    fn allocate_owned(self: Arc<Self>, _: usize, _: &StreamHandle) -> Result<Buffer, MemoryError> {
        Err(MemoryError::NoMemoryResource)
    }

    fn deallocate(&self, allocation: OwnedAllocation, _: &StreamHandle) -> Result<(), MemoryError> {
        // Frees nothing (the addresses are made up): the token is given up unused.
        self.deallocated.lock().unwrap().push(allocation.into_raw());
        Ok(())
    }

    fn accessibility(&self) -> Accessibility {
        Accessibility::device(0)
    }
}

#[derive(Debug, Clone, Copy)]
enum StreamChoice {
    None,
    Created,
    OtherDevice,
    LegacyToken,
    PerThreadToken,
}

#[derive(Debug, Clone, Copy)]
enum OwnershipChoice {
    Borrowed,
    Owner,
    Resource,
}

fn sizes() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        1usize..(1 << 16),
        Just(isize::MAX as usize),
        Just(isize::MAX as usize + 1),
        Just(usize::MAX),
    ]
}

proptest! {
    #![proptest_config(driver_config())]

    #[test]
    fn adoption_takes_nothing_it_refuses_and_frees_what_it_takes_once(
        ptr in prop_oneof![Just(0u64), 1u64..u64::MAX],
        size in sizes(),
        ownership in prop_oneof![
            Just(OwnershipChoice::Borrowed),
            Just(OwnershipChoice::Owner),
            Just(OwnershipChoice::Resource),
        ],
        choice in prop_oneof![
            Just(StreamChoice::None),
            Just(StreamChoice::Created),
            Just(StreamChoice::OtherDevice),
            Just(StreamChoice::LegacyToken),
            Just(StreamChoice::PerThreadToken),
        ],
        context_current in any::<bool>(),
    ) {
        let _serial = serial();
        let two_devices = handles::device_count().expect("cuDeviceGetCount") >= 2;
        let ledger = Arc::new(Ledger { deallocated: Mutex::new(Vec::new()) });
        let mr = Arc::clone(&ledger);
        // A fresh thread: "no context current" really means none.
        let outcome = std::thread::spawn(move || -> Result<(), String> {
            // Held for the whole thread: a context current on it stays alive.
            let context = primary();
            if context_current {
                context.make_current().expect("cuCtxSetCurrent");
            }
            let stream = match choice {
                StreamChoice::None => None,
                StreamChoice::Created => Some(stream()),
                StreamChoice::OtherDevice if two_devices => Some(
                    StreamHandle::create(&ContextHandle::primary(1).unwrap(), StreamFlags::DEFAULT, 0).unwrap(),
                ),
                StreamChoice::OtherDevice => Some(stream()),
                StreamChoice::LegacyToken => Some(StreamHandle::legacy()),
                StreamChoice::PerThreadToken => Some(StreamHandle::per_thread()),
            };
            let owned = matches!(ownership, OwnershipChoice::Resource);
            let ownership = match ownership {
                OwnershipChoice::Borrowed => Ownership::Borrowed,
                OwnershipChoice::Owner => Ownership::Owner(Box::new(7u32)),
                OwnershipChoice::Resource => Ownership::MemoryResource(mr),
            };
            let result = adopt::from_handle(ptr, size, ownership, stream.as_ref());
            let needs_context = matches!(choice, StreamChoice::None | StreamChoice::LegacyToken | StreamChoice::PerThreadToken);
            match result {
                Ok(buffer) => {
                    if owned && (ptr == 0 || size == 0 || size > isize::MAX as usize) {
                        return Err(format!("accepted an invalid owned range 0x{ptr:x}+{size}"));
                    }
                    if owned && needs_context && !context_current {
                        return Err("recorded a token's recipe with no context current".into());
                    }
                    if !owned && stream.is_some() {
                        return Err("a stream without a memory resource was accepted".into());
                    }
                    buffer.close().map_err(|e| format!("close: {e}"))?;
                    Ok(())
                }
                Err(MemoryError::OwnershipConflict { .. }) if !owned && stream.is_some() => Ok(()),
                Err(MemoryError::InvalidSize { .. }) if owned && (size == 0 || size > isize::MAX as usize) => Ok(()),
                Err(MemoryError::Handle(HandleError::InvalidArgument { what: "ptr", .. })) if ptr == 0 => Ok(()),
                Err(MemoryError::Handle(HandleError::NoCurrentContext)) if needs_context && !context_current => Ok(()),
                Err(MemoryError::Handle(handles::HandleError::WrongDevice { expected: 0, found: 1 })) if matches!(choice, StreamChoice::OtherDevice) => Ok(()),
                Err(other) => Err(format!("undocumented error {other:?}")),
            }
        })
        .join()
        .expect("the adopting thread panicked");
        prop_assert!(outcome.is_ok(), "{:?}", outcome);
        let deallocated = ledger.deallocated.lock().unwrap().clone();
        let owned = matches!(ownership, OwnershipChoice::Resource);
        // Taken and closed: freed exactly once, with what was adopted. Refused: never.
        prop_assert!(deallocated.len() <= 1, "{:?}", deallocated);
        if let Some(&(p, s)) = deallocated.first() {
            prop_assert!(owned);
            prop_assert_eq!((p, s), (ptr, size));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Resources and buffers: random sizes, then random operations on the buffers.

fn resource(index: usize) -> (&'static str, Arc<dyn MemoryResource>) {
    match index % 6 {
        0 => (
            "device pool",
            DeviceMemoryResource::new(0).unwrap() as Arc<dyn MemoryResource>,
        ),
        1 => (
            "pinned pool",
            PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap(),
        ),
        2 => ("legacy pinned", LegacyPinnedMemoryResource::new()),
        3 => ("managed", ManagedMemoryResource::new()),
        4 => ("synchronous", SynchronousMemoryResource::new(0).unwrap()),
        _ => (
            "device pool (explicit deallocate)",
            DeviceMemoryResource::new(0).unwrap(),
        ),
    }
}

/// Orders everything issued on `from` so far before what is issued on `to` from now on: the
/// operations run on `from`, frees may be recorded on either.
fn hand_over(from: &StreamHandle, to: &StreamHandle) {
    let event =
        handles::EventHandle::create(&primary(), handles::EventFlags::DISABLE_TIMING).unwrap();
    event.record(from).unwrap();
    to.wait_event(&event).unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Fill(Vec<u8>),
    CopyToHost(usize),
    CopyFromHost(usize),
    CopyTo(usize),
    SetDeallocationStream,
    CloseOn,
    Close,
    Drop,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..6).prop_map(Op::Fill),
            (0usize..70).prop_map(Op::CopyToHost),
            (0usize..70).prop_map(Op::CopyFromHost),
            any::<usize>().prop_map(Op::CopyTo),
            Just(Op::SetDeallocationStream),
            Just(Op::CloseOn),
            Just(Op::Close),
            Just(Op::Drop),
        ],
        0..12,
    )
}

proptest! {
    #![proptest_config(driver_config())]

    #[test]
    fn allocation_of_any_size_is_refused_or_freed(
        which in 0usize..6,
        size in prop_oneof![sizes(), Just(1usize << 40)],
    ) {
        let _serial = serial();
        let baseline = Baseline::take();
        let (name, mr) = resource(which);
        let s = stream();
        match Arc::clone(&mr).allocate_owned(size, &s) {
            Ok(buffer) => {
                prop_assert_eq!(buffer.size(), size);
                prop_assert!(size <= isize::MAX as usize);
                // Zero bytes: an empty buffer, with no memory behind it (docs/decisions.md D13).
                prop_assert!(size > 0 || buffer.ptr() == 0, "{}: {:#x}", name, buffer.ptr());
                drop(buffer);
            }
            Err(MemoryError::InvalidSize { .. }) => {
                prop_assert!(size > isize::MAX as usize, "{}: {}", name, size);
            }
            Err(error) => prop_assert_eq!(
                error.code(),
                Some(handles::CudaErrorCode::OUT_OF_MEMORY),
                "{}: {} bytes: undocumented {:?}", name, size, error
            ),
        }
        drop((mr, s));
        baseline.check()?;
    }

    #[test]
    fn random_operations_on_buffers_give_documented_errors_and_leak_nothing(
        sizes in proptest::collection::vec((0usize..6, 1usize..64), 1..4),
        script in ops(),
    ) {
        let _serial = serial();
        let baseline = Baseline::take();
        let s1 = stream();
        let s2 = stream();
        let mut buffers: Vec<Option<Buffer>> = sizes
            .iter()
            .map(|&(which, size)| Some(resource(which).1.allocate_owned(size, &s1).expect("allocate")))
            .collect();
        for (step, op) in script.into_iter().enumerate() {
            let i = step % buffers.len();
            if matches!(op, Op::Drop) {
                hand_over(&s1, &s2);
                buffers[i] = None;
                continue;
            }
            // A closed buffer is gone (`close` consumed it), so every operation below runs on
            // an open one; cuda.core's closed state lives in the Python layer (test_fuzz.py).
            if buffers[i].is_none() {
                continue;
            }
            let result = match &op {
                Op::Close => {
                    hand_over(&s1, &s2);
                    buffers[i].take().expect("open").close()
                }
                Op::CloseOn => {
                    hand_over(&s1, &s2);
                    close_on(buffers[i].take().expect("open"), &s2)
                }
                _ => {
                    let buffer = buffers[i].as_ref().expect("open");
                    match &op {
                        Op::Fill(bytes) => {
                            FillValue::from_bytes(bytes).and_then(|v| buffer.fill(v, &s1))
                        }
                        Op::CopyToHost(len) => buffer.copy_to_host(&mut vec![0; *len], &s1),
                        Op::CopyFromHost(len) => buffer.copy_from_host(&vec![9; *len], &s1),
                        Op::CopyTo(j) => match buffers[j % buffers.len()].as_ref() {
                            Some(dst) => buffer.copy_to(dst, &s1),
                            None => Ok(()),
                        },
                        Op::SetDeallocationStream => {
                            hand_over(&s1, &s2);
                            buffer.set_deallocation_stream(&s2)
                        }
                        Op::Close | Op::CloseOn | Op::Drop => unreachable!("handled above"),
                    }
                }
            };
            let documented = match &result {
                Ok(()) => true,
                Err(MemoryError::InvalidFill { .. }) => matches!(op, Op::Fill(_)),
                Err(MemoryError::SizeMismatch { .. }) => {
                    matches!(op, Op::CopyToHost(_) | Op::CopyFromHost(_) | Op::CopyTo(_))
                }
                Err(_) => false,
            };
            prop_assert!(documented, "{:?} on buffer {}: {:?}", op, i, result);
        }
        // Whatever s1 did is ordered before the frees, wherever they are recorded.
        hand_over(&s1, &s2);
        drop(buffers);
        drop((s1, s2));
        baseline.check()?;
    }
}

/// cuda.core's `close(stream)` in Rust: hand the free over to `stream`, then close
/// (docs/decisions.md D4).
fn close_on(buffer: Buffer, stream: &StreamHandle) -> Result<(), MemoryError> {
    buffer.set_deallocation_stream(stream)?;
    buffer.close()
}
