"""A ctypes view of the CUDA driver that a Python CUDA library has loaded, for the examples.

`handoff.py` and `differential.py` use it to see what the libraries they exercise cannot tell
them: the context current on a thread, a memory pool's used bytes, and, on custody's emulated
driver, the driver's own call log and hazard checker.

It opens the same library the CUDA package opened (`CUSTODY_CUDA_DRIVER` or `libcuda.so.1` for
custody, `libcuda.so.1` for cuda.core). The dynamic loader hands back the already-loaded copy, so
the per-thread context stacks and the emulator's logs seen here are the ones the package uses.
Standard library only (Python 3.9+).
"""

import ctypes
import json
import os

DRIVER_ENV = "CUSTODY_CUDA_DRIVER"
SYSTEM_DRIVER = "libcuda.so.1"
# CUmemPool_attribute: CU_MEMPOOL_ATTR_USED_MEM_CURRENT.
USED_MEM_CURRENT = 7


def custody_driver_path():
    """The library custody loads: CUSTODY_CUDA_DRIVER, else the system driver."""
    return os.environ.get(DRIVER_ENV) or SYSTEM_DRIVER


class DriverError(RuntimeError):
    """A driver call made by this module failed."""


class DriverView:
    """The driver library at `path`, already loaded by the CUDA package under test."""

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.emulated = _has(self.lib, "custodyEmuVersion")
        if self.emulated:
            self.lib.custodyEmuQuery.restype = ctypes.c_size_t
            self.lib.custodyEmuQuery.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
            self.lib.custodyEmuThreadId.restype = ctypes.c_ulonglong

    def _call(self, name, *args):
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise DriverError("%s returned %d" % (name, status))

    def version(self):
        """`cuDriverGetVersion`, e.g. 13000."""
        value = ctypes.c_int(0)
        self._call("cuDriverGetVersion", ctypes.byref(value))
        return value.value

    def device_name(self, ordinal=0):
        """Device `ordinal`'s name (the driver must be initialised)."""
        device = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(device), ordinal)
        name = ctypes.create_string_buffer(256)
        self._call("cuDeviceGetName", name, 256, device)
        return name.value.decode(errors="replace")

    def describe(self):
        """One line: which driver, which version, real GPU or emulator."""
        version = self.version()
        text = "%s, CUDA %d.%d (%d)" % (self.path, version // 1000, version % 1000 // 10, version)
        if self.emulated:
            return "emulated driver (cuda-emu, no GPU): " + text
        try:
            return "real GPU: %s; driver %s" % (self.device_name(0), text)
        except DriverError as error:
            return "real driver (device 0 unreadable: %s): %s" % (error, text)

    def current_context(self):
        """The raw context current on the calling thread; 0 for none."""
        ctx = ctypes.c_void_p(0)
        self._call("cuCtxGetCurrent", ctypes.byref(ctx))
        return ctx.value or 0

    def synchronize(self):
        """`cuCtxSynchronize` in the calling thread's current context."""
        self._call("cuCtxSynchronize")

    def pool_used(self, ordinal=0):
        """Bytes in use in device `ordinal`'s current memory pool."""
        device = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(device), ordinal)
        pool = ctypes.c_void_p(0)
        self._call("cuDeviceGetMemPool", ctypes.byref(pool), device)
        value = ctypes.c_uint64(0)
        self._call("cuMemPoolGetAttribute", pool, USED_MEM_CURRENT, ctypes.byref(value))
        return value.value

    def mem_alloc(self, size):
        """`cuMemAlloc_v2` in the current context: a pointer for adoption scenarios."""
        ptr = ctypes.c_uint64(0)
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
        return ptr.value

    def mem_free(self, ptr):
        """`cuMemFree_v2` (needs no current context: docs/driver-facts.md F5)."""
        self._call("cuMemFree_v2", ctypes.c_uint64(ptr))

    # The emulator's query interface (custody's cuda-emu only).

    def _query(self, what):
        if not self.emulated:
            return []
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            needed = self.lib.custodyEmuQuery(what.encode(), buf, size)
            if needed < size:
                return json.loads(buf.value.decode() or "[]")
            size = needed + 1

    def calls(self):
        """The emulator's call log: dicts with seq, function, thread, context, stream,
        resolved_stream, ptr, result. Empty on a real driver."""
        return self._query("calls")

    def hazards(self):
        """Stream-order hazards the emulator saw (kind, ptr, function, stream, detail)."""
        return self._query("hazards")

    def mark(self):
        """The sequence number the next logged call gets (0 on a real driver)."""
        calls = self.calls()
        return calls[-1]["seq"] + 1 if calls else 0

    def thread_id(self):
        """The calling thread's id in the emulator's call log (None on a real driver)."""
        return int(self.lib.custodyEmuThreadId()) if self.emulated else None

    def frees_of(self, ptr, since=0):
        """Logged frees (`cuMemFree*`) of `ptr` with seq >= `since`."""
        return [c for c in self.calls()
                if c["seq"] >= since and c.get("ptr") == ptr and c["function"].startswith("cuMemFree")]


def _has(lib, name):
    try:
        getattr(lib, name)
    except AttributeError:
        return False
    return True
