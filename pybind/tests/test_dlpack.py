"""DLPack: __dlpack__ returns a "dltensor" capsule of a 1-D uint8 tensor over the buffer; its
deleter releases a reference to the memory; __dlpack_device__ classifies the memory."""

import ctypes
import gc

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


def test_capsule_describes_the_buffer(device, stream):
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(1000, stream=stream)
    capsule = buf.__dlpack__(stream=stream, max_version=(1, 0), dl_device=(2, 0), copy=False)
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
