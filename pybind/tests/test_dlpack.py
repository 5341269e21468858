"""DLPack: __dlpack__ returns a "dltensor" capsule of a 1-D uint8 tensor over the buffer, or with
max_version >= (1, 0) a "dltensor_versioned" one (DLPack 1.0, writable); its deleter releases a
reference to the memory; __dlpack_device__ classifies the memory (managed memory as
kDLCUDAManaged, 13, also when adopted)."""

import ctypes
import gc

import pytest

import custody
from conftest import needs_emulator


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]

class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_IsValid.restype = ctypes.c_int
api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def tensor_of(capsule):
    assert api.PyCapsule_IsValid(capsule, b"dltensor") == 1
    address = api.PyCapsule_GetPointer(capsule, b"dltensor")
    return ctypes.cast(address, ctypes.POINTER(DLManagedTensor))


def versioned_tensor_of(capsule):
    assert api.PyCapsule_IsValid(capsule, b"dltensor_versioned") == 1
    address = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    return ctypes.cast(address, ctypes.POINTER(DLManagedTensorVersioned))


def test_capsule_describes_the_buffer(device, stream):
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(1000, stream=stream)
    capsule = buf.__dlpack__(stream=stream, max_version=None, dl_device=(2, 0), copy=False)
    t = tensor_of(capsule).contents.dl_tensor
    assert t.data == buf.handle
    assert (t.device.device_type, t.device.device_id) == (2, 0)
    assert t.ndim == 1 and t.shape[0] == 1000 and not t.strides and t.byte_offset == 0
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1)
    assert buf.__dlpack_device__() == (2, 0)
    del capsule
    buf.close()


def test_dlpack_devices(device, stream):
    cases = [
        (custody.PinnedMemoryResource(), (3, 0)),
        (custody.LegacyPinnedMemoryResource(), (3, 0)),
        (custody.ManagedMemoryResource(), 13),
        (custody.LegacyManagedMemoryResource(), 13),
        (custody.SynchronousMemoryResource(0), (2, 0)),
    ]
    for mr, expected in cases:
        buf = mr.allocate(64, stream=stream)
        got = buf.__dlpack_device__()
        if isinstance(expected, int):
            assert got[0] == expected
        else:
            assert got == expected
        buf.close()


@needs_emulator
def test_unconsumed_capsule_keeps_the_memory_until_collected(device, stream, emu):
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    capsule = buf.__dlpack__()
    buf.close()
    assert emu.is_live(alloc), "the capsule holds a reference"
    del capsule
    gc.collect()
    assert not emu.is_live(alloc)


@needs_emulator
def test_consumer_calls_the_deleter(device, stream, emu):
    """A consumer renames the capsule "used_dltensor" and calls the deleter itself; the capsule's
    destructor then does nothing (no double release)."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    capsule = buf.__dlpack__()
    managed = tensor_of(capsule)
    assert api.PyCapsule_SetName(capsule, b"used_dltensor") == 0
    del capsule
    gc.collect()
    buf.close()
    assert emu.is_live(alloc), "the consumer still owns the tensor"
    managed.contents.deleter(managed)
    assert not emu.is_live(alloc)
    assert len(emu.calls_to("cuMemFreeAsync", alloc=alloc)) == 1


def test_versioned_capsule_is_dlpack_1_and_writable(device, stream):
    """max_version >= (1, 0): a DLManagedTensorVersioned, version 1.0, no flags (so consumers
    such as numpy.from_dlpack make writable arrays of pinned or managed memory)."""
    for mr in (custody.PinnedMemoryResource(), custody.ManagedMemoryResource()):
        buf = mr.allocate(256, stream=stream)
        capsule = buf.__dlpack__(max_version=(1, 0))
        assert api.PyCapsule_IsValid(capsule, b"dltensor") == 0
        managed = versioned_tensor_of(capsule).contents
        assert (managed.version.major, managed.version.minor) == (1, 0)
        assert managed.flags == 0, "neither read-only nor a copy"
        t = managed.dl_tensor
        assert t.data == buf.handle and t.shape[0] == 256
        assert (t.device.device_type, t.device.device_id) == buf.__dlpack_device__()
        del capsule
        buf.close()
    # A newer major version is answered with the newest this producer has.
    buf = custody.DeviceMemoryResource(0).allocate(8, stream=stream)
    assert versioned_tensor_of(buf.__dlpack__(max_version=(2, 3))).contents.version.major == 1
    buf.close()


def test_dlpack_argument_errors_name_what_was_wrong(device, stream):
    buf = custody.DeviceMemoryResource(0).allocate(8, stream=stream)
    for bad in [(), (9, 8, 7), "x"]:
        with pytest.raises(BufferError, match=r"^Expected max_version tuple\[int, int\], got "):
            buf.__dlpack__(max_version=bad)
    # The buffer's own device is accepted (what NumPy's from_dlpack(device=...) names), so the
    # message says so and names the device asked for.
    with pytest.raises(
        BufferError,
        match=r"^Sorry, not supported: dl_device other than None or the buffer's own \(2, 0\), "
        r"got \(1, 0\)$",
    ):
        buf.__dlpack__(dl_device=(1, 0))
    buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match=r"^Sorry, not supported: copy=True$"):
        buf.__dlpack__(copy=True)
    buf.close()


def test_adopted_managed_memory_reports_the_managed_device_type(device, stream):
    """Memory adopted with from_handle (owner=, or a Python resource) is classified by the
    driver: managed memory is kDLCUDAManaged (13), not kDLCUDAHost."""
    owner = custody.LegacyManagedMemoryResource().allocate(64, stream=stream)
    view = custody.Buffer.from_handle(owner.handle, 64, owner=owner)
    assert view.__dlpack_device__() == (13, 0)
    assert versioned_tensor_of(view.__dlpack__(max_version=(1, 0))).contents.dl_tensor.device.device_type == 13
    view.close()
    owner.close()


def test_neither_accessible_is_a_buffer_error(device, stream):
    class Nowhere(custody.MemoryResource):
        def allocate(self, size, *, stream=None):
            raise NotImplementedError

        def deallocate(self, ptr, size, *, stream=None):
            pass

        is_device_accessible = False
        is_host_accessible = False
        device_id = -1

    pool = custody.DeviceMemoryResource(0)
    backing = pool.allocate(16, stream=stream)
    buf = custody.Buffer.from_handle(backing.handle, 16, mr=Nowhere(), stream=stream)
    with pytest.raises(BufferError, match="neither device-accessible nor host-accessible"):
        buf.__dlpack_device__()
    with pytest.raises(BufferError, match="neither device-accessible nor host-accessible"):
        buf.__dlpack__()
    buf.close()
    backing.close()


def test_zero_size_buffers_export_an_empty_tensor(device, stream):
    """A zero-size buffer (``allocate(0)``, ``from_handle(0, 0)``) exports a valid 1-D tensor of
    shape ``(0,)`` in both capsule forms, on the device ``__dlpack_device__`` names: kDLCUDA for
    the device resource's. (For the view at address 0 the driver's pointer attributes say which
    device; that answer is not asserted here.)"""
    mr = custody.DeviceMemoryResource(0)
    for buf, expected in [(mr.allocate(0, stream=stream), (2, 0)),
                          (custody.Buffer.from_handle(0, 0), None)]:
        device_type, device_id = buf.__dlpack_device__()
        assert expected in (None, (device_type, device_id))
        capsules = (buf.__dlpack__(), buf.__dlpack__(max_version=(1, 0)))  # kept while read
        for t in (tensor_of(capsules[0]).contents.dl_tensor,
                  versioned_tensor_of(capsules[1]).contents.dl_tensor):
            assert (t.ndim, t.shape[0]) == (1, 0)
            assert (t.device.device_type, t.device.device_id) == (device_type, device_id)
        del t, capsules
        buf.close()
