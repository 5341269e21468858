"""Probe: does running a Python program under compute-sanitizer keep Python objects alive that
the program let go of? The sanitizer's reports name Python frames ("Host Frame: allocate in
test_reentrancy.py:41"), so it walks the Python stack at driver calls. If it also keeps the
frames it walked, each frame keeps its locals at the time the function returned, and a buffer
that was a local of such a frame is never freed. That would explain the pytest tests that fail
under the sanitizer only (a Python ``deallocate`` never called, pool bytes never back:
docs/gpu-validation.md, "Under compute-sanitizer"). No driver work beyond custody's own
allocation and free; custody's wheel must be importable.

    python3 docs/driver-probe/sanitizer_python_frames.py
    compute-sanitizer --tool memcheck --leak-check full python3 docs/driver-probe/sanitizer_python_frames.py

The H200's answers are in h200-580.159.04-sanitizer-python-frames.txt beside this file.

Prints, for two buffers made inside nested functions, what refers to each (the kinds of object,
and the frames by function name), then whether dropping the caller's last reference freed it
(a weak reference to a Python wrapper that holds the buffer). Plain, a buffer's referrers are
the caller's own names only and the drop frees it; a sanitizer that keeps frames shows
``frame`` referrers and ``freed after del: False``.
"""

import gc
import sys
import weakref

import custody


class Holder:
    """A weakly referable wrapper, so that the probe can see when the buffer goes."""

    def __init__(self, buffer):
        self.buffer = buffer


dev = custody.Device(0)
dev.set_current()
stream = dev.create_stream()
pool = custody.DeviceMemoryResource(0)


def make():
    # The allocation is a driver call made while this frame and its callers are on the stack.
    holder = Holder(pool.allocate(64, stream=stream))
    return holder


def outer():
    first = make()
    second = make()
    return first, second


first, second = outer()
for name, held in (("first", first), ("second", second)):
    referrers = [r for r in gc.get_referrers(held) if r is not globals()]
    frames = [r.f_code.co_name for r in referrers if type(r).__name__ == "frame"]
    print(f"{name}: refcount {sys.getrefcount(held)}, referrers "
          f"{sorted(type(r).__name__ for r in referrers)}, frames {frames}")
    del referrers
gone = weakref.ref(first)
del first, held
gc.collect()
print("freed after del:", gone() is None)
stream.sync()
