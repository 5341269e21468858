"""Reference cycles through custody's objects are collected (docs/decisions.md D10): a Buffer
whose ``owner=`` object holds the buffer, a Python memory resource that keeps its own buffers in
a list, a pool resource subclass that does the same, a stream wrapper that keeps its custody
Stream. ``gc.collect()`` frees them, and a free through a Python ``deallocate`` still gets its
recorded stream, its recipe's context and an intact resource (the collector frees such memory
before it clears any object of the cycle). While another holder (a DLPack capsule) shares the
memory, the cycle is kept: nothing it keeps alive is cleared under that holder."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref

import custody
from conftest import DRIVER, EMU, cuda_warnings, current_context


def pool_used(mr) -> int:
    return mr.attributes.used_mem_current


class Owner:
    """Keeps pool memory alive and holds the view that names it as its owner."""

    def __init__(self, pool, stream, size=256):
        self.backing = pool.allocate(size, stream=stream)
        self.view = custody.Buffer.from_handle(self.backing.handle, size, owner=self)


def test_owner_holding_its_buffer_is_collected(device, stream):
    pool = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    before = pool_used(pool)
    owner = Owner(pool, stream)
    ptr = owner.backing.handle
    alive = weakref.ref(owner)
    assert owner.view.owner is owner
    del owner
    gc.collect()
    assert alive() is None, "the owner <-> buffer cycle was not collected"
    stream.sync()
    assert pool_used(pool) == before
    if EMU is not None:
        assert ptr not in EMU.live_pointers()


class ListResource(custody.MemoryResource):
    """A Python resource that keeps every buffer it hands out in a list (a cycle through each
    buffer's resource). ``deallocate`` records what it was given and whether it is intact."""

    def __init__(self, log):
        self.pool = custody.DeviceMemoryResource(0)
        self.buffers = []
        self.backing = {}
        self.lock = threading.Lock()
        self.log = log

    def allocate(self, size, *, stream):
        backing = self.pool.allocate(size, stream=stream)
        self.backing[backing.handle] = backing
        buf = custody.Buffer.from_handle(backing.handle, size, mr=self, stream=stream)
        self.buffers.append(buf)
        return buf

    def deallocate(self, ptr, size, *, stream):
        intact = all(hasattr(self, name) for name in ("pool", "buffers", "backing", "lock"))
        self.log.append(
            {"ptr": ptr, "stream": stream.handle, "context": current_context(), "intact": intact}
        )
        with self.lock:
            self.backing.pop(ptr).close(stream=stream)

    @property
    def is_device_accessible(self):
        return True

    @property
    def is_host_accessible(self):
        return False

    @property
    def device_id(self):
        return 0


def test_python_resource_keeping_its_buffers_is_collected(device, recorded_warnings):
    log = []
    mr = ListResource(log)
    streams = [device.create_stream() for _ in range(3)]
    made = {mr.allocate(128, stream=s).handle: s.handle for s in streams}
    alive = weakref.ref(mr)
    del mr
    gc.collect()
    assert alive() is None, "the resource <-> buffers cycle was not collected"
    assert sorted(e["ptr"] for e in log) == sorted(made)
    for entry in log:
        assert entry["stream"] == made[entry["ptr"]], "deallocate got another stream"
        assert entry["context"] == device.context.handle
        assert entry["intact"], "deallocate ran on a cleared resource"
    assert cuda_warnings(recorded_warnings) == []


def test_managed_buffers_of_a_python_resource_are_collected(device, stream):
    log = []

    class ManagedList(ListResource):
        is_managed = property(lambda self: True)

        def allocate(self, size, *, stream):
            backing = self.pool.allocate(size, stream=stream)
            self.backing[backing.handle] = backing
            buf = custody.ManagedBuffer.from_handle(backing.handle, size, mr=self, stream=stream)
            self.buffers.append(buf)
            return buf

    mr = ManagedList(log)
    ptr = mr.allocate(64, stream=stream).handle
    assert isinstance(mr.buffers[0], custody.ManagedBuffer)
    alive = weakref.ref(mr)
    del mr
    gc.collect()
    assert alive() is None
    assert [(e["ptr"], e["intact"]) for e in log] == [(ptr, True)]


def test_pool_subclass_keeping_its_buffers_is_collected(device, stream):
    class KeepingPool(custody.DeviceMemoryResource):
        def __init__(self, *args):
            super().__init__()
            self.kept = []

        def allocate(self, size, *, stream):
            buf = super().allocate(size, stream=stream)
            self.kept.append(buf)
            return buf

    mr = KeepingPool(0, custody.DeviceMemoryResourceOptions())
    before = pool_used(mr)
    attributes = mr.attributes  # reads the pool, which outlives the resource object
    ptrs = [mr.allocate(64, stream=stream).handle for _ in range(4)]
    assert pool_used(mr) > before
    alive = weakref.ref(mr)
    del mr
    gc.collect()
    assert alive() is None
    stream.sync()
    assert attributes.used_mem_current == before
    if EMU is not None:
        assert not set(ptrs) & EMU.live_pointers()


def test_cycle_kept_while_a_capsule_shares_the_memory(device, stream):
    """A DLPack capsule holds the memory (and so the owner): the cycle is not collected, and
    the owner is not cleared, until the capsule goes; then it is."""
    pool = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    before = pool_used(pool)
    owner = Owner(pool, stream)
    capsule = owner.view.__dlpack__()
    alive = weakref.ref(owner)
    del owner
    gc.collect()
    assert alive() is not None, "collected while a capsule still holds its memory"
    assert alive().backing.size == 256, "the owner was cleared while still in use"
    del capsule
    gc.collect()
    assert alive() is None
    stream.sync()
    assert pool_used(pool) == before


def test_cycle_through_a_stream_wrapper_is_collected(device):
    """An object with ``__cuda_stream__`` (a stream made outside custody) that keeps the custody
    Stream wrapping it: the Stream holds the object, the object holds the Stream."""
    DRIVER.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    DRIVER.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
    raw = ctypes.c_void_p()
    assert DRIVER.cuStreamCreate(ctypes.byref(raw), 1) == 0  # CU_STREAM_NON_BLOCKING

    class Wrapper:
        def __init__(self, handle):
            self.handle = handle
            self.wrapped = custody.Stream.from_handle(self)

        def __cuda_stream__(self):
            return (0, self.handle)

    w = Wrapper(raw.value)
    assert w.wrapped.handle == raw.value
    alive = weakref.ref(w)
    del w
    gc.collect()
    assert alive() is None, "the wrapper <-> Stream cycle was not collected"
    assert DRIVER.cuStreamDestroy_v2(raw) == 0


def test_what_a_buffer_shows_the_collector(device, stream):
    """``gc.get_referents`` of a buffer (its traversal, which takes no lock): its memory
    resource always; the owner its memory's handle keeps only while the buffer alone holds the
    memory (not while a DLPack capsule shares it, not once closed)."""
    pool = custody.DeviceMemoryResource(0)
    buf = pool.allocate(64, stream=stream)

    def shown(buffer):
        return [o for o in gc.get_referents(buffer) if o is not type(buffer)]

    assert shown(buf) == [pool]
    owner = Owner(pool, stream)
    view = owner.view
    assert shown(view) == [owner]
    capsule = view.__dlpack__()
    assert shown(view) == [], "shared with a capsule: not the buffer's"
    del capsule
    assert shown(view) == [owner]
    view.close()
    assert shown(view) == [], "closed: the buffer holds nothing"
    buf.close()
    assert shown(buf) == [pool], "the resource object goes with the buffer object"
    owner.view = None
    owner.backing.close()
    stream.sync()
