"""Hostile input, Python side: property-based tests (hypothesis) of the public API.
Whatever the arguments (ints of any sign and size, None, floats, strings, bytes of any length,
closed objects, random operation scripts): only the documented exceptions (``TypeError``,
``ValueError``, ``OverflowError``, ``RuntimeError`` and its ``CUDAError``), never a crash or a
Rust panic (pyo3's ``PanicException`` is a ``BaseException`` and fails the test), no
``CUDAWarning``, and no leak: after every example nothing it allocated is still allocated (the
emulator's live allocations when it is the driver; the pool's ``used_mem_current`` everywhere),
and a Python memory resource's ``deallocate`` ran once for each pointer it was given and never
for one that was refused.

Derandomized (the same examples every run; a failure prints the minimal example and how to
reproduce it). ``CUSTODY_FUZZ_EXAMPLES`` sets the examples per property (default 30);
``CUSTODY_FUZZ_RANDOM=1`` draws new examples each run.
"""

from __future__ import annotations

import gc
import os
import threading

import pytest

hypothesis = pytest.importorskip(
    "hypothesis", reason="hypothesis is not installed (cargo xtask test installs it into .venv)"
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import custody  # noqa: E402
from conftest import EMU, cuda_warnings, drain_until  # noqa: E402

DOCUMENTED = (TypeError, ValueError, OverflowError, RuntimeError)

FUZZ = settings(
    max_examples=int(os.environ.get("CUSTODY_FUZZ_EXAMPLES", "30")),
    derandomize=os.environ.get("CUSTODY_FUZZ_RANDOM", "0") == "0",
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Anything a caller might pass where an int, a stream or a resource is expected.
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64]),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
)


class Ledger(custody.MemoryResource):
    """A Python memory resource that frees nothing and records every ``deallocate``."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def allocate(self, size, *, stream):
        raise RuntimeError("a ledger does not allocate")

    def deallocate(self, ptr, size, *, stream):
        with self.lock:
            self.calls.append((ptr, size))

    @property
    def is_device_accessible(self):
        return True

    @property
    def is_host_accessible(self):
        return False

    @property
    def device_id(self):
        return 0


class Baseline:
    """What must be back where it was after an example."""

    def __init__(self, device):
        self.device = device
        self.pool = custody.DeviceMemoryResource(0)
        self.settle()
        # Identities, not addresses: a pool hands freed addresses out again (F18).
        self.live = EMU.live_ids() if EMU is not None else set()
        self.used = self.pool.attributes.used_mem_current

    def used_now(self):
        """The pool's used bytes once the device is idle."""
        self.device.sync()
        return self.pool.attributes.used_mem_current

    def settle(self):
        custody.drain_deferred_cleanup()
        gc.collect()
        custody.drain_deferred_cleanup()
        self.device.sync()

    def check(self):
        self.settle()
        # The pool's bytes come back when the device reaches each free; a free the cleanup
        # worker or a driver thread issues (a graph's user object, G1) may come after the
        # settle, as it did under compute-sanitizer: polled, then asserted.
        drain_until(lambda: self.used_now() == self.used)
        assert self.used_now() == self.used
        if EMU is not None:
            left = [a for a in EMU.allocations() if a["id"] not in self.live]
            assert left == [], left
            assert EMU.hazards() == []


def documented(fn, *args, **kwargs):
    """Calls fn; returns its result, or None when it raised a documented exception."""
    try:
        return fn(*args, **kwargs)
    except DOCUMENTED as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return None


@FUZZ
@given(data=st.binary(max_size=200))
def test_descriptor_bytes(data):
    desc = documented(custody.IPCBufferDescriptor.from_bytes, data)
    if desc is not None:
        assert bytes(desc) == data
        assert desc.size > 0


@FUZZ
@given(
    data=st.binary(min_size=96, max_size=96),
    magic=st.booleans(),
    flips=st.lists(st.tuples(st.integers(0, 95), st.integers(0, 255)), max_size=4),
)
def test_descriptor_bytes_near_valid(data, magic, flips):
    raw = bytearray(data)
    if magic:
        raw[0:8] = b"CUSTDIPC"
        raw[8:16] = (1).to_bytes(4, "little") + (1).to_bytes(4, "little")
        raw[20:24] = bytes(4)
    for at, value in flips:
        raw[at] = value
    desc = documented(custody.IPCBufferDescriptor.from_bytes, bytes(raw))
    if desc is not None:
        assert bytes(desc) == bytes(raw)


@FUZZ
@given(
    ptr=st.one_of(junk, st.integers(min_value=1, max_value=2**64 - 1)),
    size=st.one_of(junk, st.integers(min_value=1, max_value=1 << 20)),
    with_mr=st.booleans(),
    owner=st.sampled_from([None, object()]),
    stream_kind=st.sampled_from(["none", "created", "legacy", "ptds", "closed", "junk"]),
)
def test_from_handle_takes_nothing_it_refuses(device, recorded_warnings, ptr, size, with_mr, owner, stream_kind):
    baseline = Baseline(device)
    ledger = Ledger()
    created = device.create_stream()
    closed = device.create_stream()
    closed.close()
    stream = {
        "none": None,
        "created": created,
        "legacy": custody.LEGACY_DEFAULT_STREAM,
        "ptds": custody.PER_THREAD_DEFAULT_STREAM,
        "closed": closed,
        "junk": 7,
    }[stream_kind]
    kwargs = {} if stream is None else {"stream": stream}
    buf = documented(custody.Buffer.from_handle, ptr, size, ledger if with_mr else None, owner, **kwargs)
    if buf is not None:
        assert buf.handle == ptr and buf.size == size
        assert ledger.calls == []
        buf.close()
        buf.close()
        assert buf.is_closed
    del buf
    gc.collect()
    # A refused adoption never reaches deallocate; an accepted one with mr, exactly once.
    assert len(ledger.calls) <= 1
    if ledger.calls:
        assert with_mr and ledger.calls == [(ptr, size)]
    created.close()
    assert cuda_warnings(recorded_warnings) == []
    baseline.check()


RESOURCES = [
    lambda: custody.DeviceMemoryResource(0),
    lambda: custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions()),
    lambda: custody.PinnedMemoryResource(),
    lambda: custody.LegacyPinnedMemoryResource(),
    lambda: custody.ManagedMemoryResource(),
    lambda: custody.SynchronousMemoryResource(0),
]


@FUZZ
@given(which=st.integers(0, len(RESOURCES) - 1), size=st.one_of(junk, st.just(1 << 40)), stream_junk=st.booleans())
def test_allocate_any_size(device, recorded_warnings, which, size, stream_junk):
    baseline = Baseline(device)
    mr = RESOURCES[which]()
    s = device.create_stream()
    buf = documented(mr.allocate, size, stream="junk" if stream_junk else s)
    if buf is not None:
        assert buf.size == size
        buf.close()
    del buf
    s.close()
    assert cuda_warnings(recorded_warnings) == []
    baseline.check()


op = st.one_of(
    st.tuples(st.just("fill"), st.one_of(junk, st.integers(0, 255), st.binary(max_size=5))),
    st.tuples(st.just("copy_to"), st.integers(0, 3)),
    st.tuples(st.just("copy_to_new"), st.none()),
    st.tuples(st.just("copy_from"), st.integers(0, 3)),
    st.tuples(st.just("set_deallocation_stream"), st.sampled_from(["other", "junk", "none"])),
    st.tuples(st.just("close"), st.sampled_from([None, "other", "junk"])),
    st.tuples(st.just("del"), st.none()),
    st.tuples(st.just("dlpack"), st.none()),
    st.tuples(st.just("ipc_descriptor"), st.none()),
)


@FUZZ
@given(
    sizes=st.lists(st.tuples(st.integers(0, len(RESOURCES) - 1), st.integers(1, 64)), min_size=1, max_size=4),
    script=st.lists(op, max_size=12),
)
def test_random_operation_scripts(device, recorded_warnings, sizes, script):
    baseline = Baseline(device)
    s1, s2 = device.create_stream(), device.create_stream()

    def hand_over():
        # Everything issued on s1 comes before what s2 does next: frees on s2 are ordered.
        s2.wait(s1.record())

    def play():
        """The script; every buffer it made is gone when it returns."""
        bufs = [RESOURCES[which]().allocate(size, stream=s1) for which, size in sizes]
        for step, (name, arg) in enumerate(script):
            i = step % len(bufs)
            b = bufs[i]
            if b is None:
                continue
            if name == "fill":
                documented(b.fill, arg, stream=s1)
            elif name == "copy_to":
                dst = bufs[arg % len(bufs)]
                if dst is not None:
                    documented(b.copy_to, dst, stream=s1)
            elif name == "copy_to_new":
                new = documented(b.copy_to, stream=s1)
                if new is not None:
                    bufs.append(new)
            elif name == "copy_from":
                src = bufs[arg % len(bufs)]
                if src is not None:
                    documented(b.copy_from, src, stream=s1)
            elif name == "set_deallocation_stream":
                hand_over()
                documented(b.set_deallocation_stream, {"other": s2, "junk": 3, "none": None}[arg])
            elif name == "close":
                hand_over()
                if arg is None:
                    documented(b.close)
                else:
                    documented(b.close, stream={"other": s2, "junk": "x"}[arg])
            elif name == "del":
                hand_over()
                bufs[i] = None
            elif name == "dlpack":
                documented(b.__dlpack_device__)
            elif name == "ipc_descriptor":
                documented(lambda: b.ipc_descriptor)
        hand_over()

    play()
    s1.close()
    s2.close()
    assert cuda_warnings(recorded_warnings) == []
    baseline.check()
