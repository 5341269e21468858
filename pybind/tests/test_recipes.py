"""Recipe capture and binding, set_deallocation_stream / close(stream), from_handle ownership
(docs/reference-notes.md section 5, scenarios 1-3, 5, 7-12, 14-20, 39, 41, 45, 46, 74;
docs/decisions.md D1, D4, D5)."""

import ctypes
import gc
import subprocess
import sys
import textwrap

import pytest

import custody
from conftest import (
    DRIVER,
    RecordingResource,
    current_context,
    needs_emulator,
    run_in_thread,
)


def free_calls(emu, alloc):
    """The frees of allocation ``alloc`` (its identity: a pool hands freed addresses out again)."""
    return emu.calls_to("cuMemFreeAsync", alloc=alloc)


def test_legacy_token_binds_the_current_context(device, emu, no_hazards):
    """1: a legacy-stream allocation records 0x1 bound to ctx A; the free runs in A on 0x1."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(256, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    ctx = device.context.handle
    assert current_context() == ctx
    assert run_in_thread(lambda: (buf.close(), current_context())[1]) == 0
    assert buf.is_closed and buf.size == 0 and buf.handle == 0
    if emu:
        (free,) = free_calls(emu, alloc)
        assert free["stream"] == 0x1 and free["context"] == ctx and free["result"] == 0


def test_per_thread_token_binds_context_and_thread(device, emu, recorded_warnings):
    """2, 35: PTDS recorded and freed on the same thread: no warning, freed on 0x2 in A."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.PER_THREAD_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    del buf
    gc.collect()
    assert [w for w in recorded_warnings if issubclass(w.category, custody.CUDAWarning)] == []
    if emu:
        (free,) = free_calls(emu, alloc)
        assert free["stream"] == 0x2 and free["context"] == device.context.handle


def test_created_stream_recipe_needs_no_context_lookup(device, stream, emu, no_hazards):
    """3: a created stream carries its context; recording it makes no cuCtxGetCurrent for the
    recipe (the one for the allocation itself aside), and the free is on that stream."""
    mr = custody.DeviceMemoryResource(0)
    if emu:
        emu.clear_calls()
    buf = mr.allocate(64, stream=stream)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    if emu:
        names = [c["function"] for c in emu.calls()]
        assert names.count("cuCtxGetCurrent") <= 1, names
    buf.close()
    if emu:
        (free,) = free_calls(emu, alloc)
        assert free["stream"] == stream.handle


def test_no_context_is_one_runtime_error_everywhere(device):
    """5 and section 6 item 5: every "no context" situation is the same RuntimeError."""
    mr = custody.DeviceMemoryResource(0)
    rec = RecordingResource()
    ptr = rec.raw_allocate(64, custody.LEGACY_DEFAULT_STREAM)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)

    def attempts():
        errors = []
        for attempt in (
            lambda: mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM),
            lambda: custody.Buffer.from_handle(ptr, 64, mr=rec),
            lambda: buf.set_deallocation_stream(custody.LEGACY_DEFAULT_STREAM),
            lambda: buf.close(stream=custody.PER_THREAD_DEFAULT_STREAM),
            lambda: custody.LEGACY_DEFAULT_STREAM.sync(),
            lambda: custody.LEGACY_DEFAULT_STREAM.context,
        ):
            with pytest.raises(RuntimeError) as info:
                attempt()
            errors.append(info.value)
        return errors

    errors = run_in_thread(attempts)
    for error in errors:
        assert type(error) is RuntimeError, repr(error)
        assert str(error).startswith("no CUDA context is current"), str(error)
    assert not buf.is_closed, "a failed close(stream) leaves the buffer open"
    assert rec.calls == [], "a refused adoption never calls deallocate (D5)"
    buf.close()
    rec.release_all()


def test_never_initialised_process_gets_the_same_error(tmp_path):
    """5: in a process that never initialised CUDA, adopting with a default stream raises the one
    "no context" RuntimeError (custody unifies it; cuda.core raised CUDA_ERROR_NOT_INITIALIZED)."""
    script = textwrap.dedent(
        """
        import custody
        class HostMR(custody.MemoryResource):
            calls = []
            def deallocate(self, ptr, size, *, stream):
                self.calls.append(ptr)
            is_device_accessible = property(lambda self: True)
            is_host_accessible = property(lambda self: False)
            device_id = property(lambda self: 0)
        mr = HostMR()
        try:
            custody.Buffer.from_handle(0x1000, 16, mr=mr)
        except RuntimeError as e:
            assert type(e) is RuntimeError and str(e).startswith("no CUDA context is current"), e
            assert mr.calls == []
            print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_from_handle_argument_rules(device, stream):
    """7 and D5: stream without mr, mr with owner -> ValueError; a bad stream with mr ->
    TypeError; and deallocate is never called for a refused adoption."""
    rec = RecordingResource()
    ptr = rec.raw_allocate(64, stream)
    with pytest.raises(ValueError, match="stream requires a memory resource"):
        custody.Buffer.from_handle(ptr, 64, stream=stream)
    with pytest.raises(ValueError, match="owner and memory resource cannot be both specified"):
        custody.Buffer.from_handle(ptr, 64, mr=rec, owner=object())
    with pytest.raises(TypeError, match="Stream"):
        custody.Buffer.from_handle(ptr, 64, mr=rec, stream="x")
    with pytest.raises(ValueError):
        custody.Buffer.from_handle(ptr, 0, mr=rec, stream=stream)
    assert rec.calls == []
    assert len(rec.live) == 1
    rec.release_all()


def test_adopted_buffer_is_freed_by_deallocate_with_the_recorded_stream(device, stream, emu):
    """8: the Python MR's deallocate gets ptr, size and a Stream whose handle is s.handle."""
    rec = RecordingResource()
    ptr = rec.raw_allocate(96, stream)
    buf = custody.Buffer.from_handle(ptr, 96, mr=rec, stream=stream)
    assert buf.memory_resource is rec
    del buf
    gc.collect()
    (call,) = rec.calls
    assert (call["ptr"], call["size"], call["stream"]) == (ptr, 96, stream.handle)
    assert isinstance(call["stream_obj"], custody.Stream)
    assert rec.live == {}


def test_foreign_ptds_wrapper_binds_like_the_token(device, emu, no_hazards, recorded_warnings):
    """9: Stream.from_handle(2) is the per-thread token (the value decides): a drop on another
    thread frees on the legacy stream of the bound context (D6), with no warning."""
    wrapper = custody.Stream.from_handle(2)
    assert wrapper.handle == 2
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(32, stream=wrapper)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None

    def drop():
        nonlocal buf
        del buf
        gc.collect()

    run_in_thread(drop)
    assert [w for w in recorded_warnings if issubclass(w.category, custody.CUDAWarning)] == []
    if emu:
        (free,) = free_calls(emu, alloc)
        assert free["stream"] == 0x1 and free["context"] == device.context.handle


def test_wrapping_an_owned_stream_reuses_it(device, emu):
    """10: Stream.from_handle(int(s.handle)) of a custody-created stream reuses the owned
    stream, so a recipe recorded through it keeps the stream alive after s.close()."""
    s = device.create_stream()
    wrapper = custody.Stream.from_handle(int(s.handle))
    assert wrapper.handle == s.handle
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(32, stream=wrapper)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    s.close()
    wrapper.close()
    if emu:
        assert emu.calls_to("cuStreamDestroy_v2") == []
    buf.close()
    if emu:
        assert free_calls(emu, alloc)[0]["result"] == 0
        assert len(emu.calls_to("cuStreamDestroy_v2")) == 1
        assert emu.hazards() == []


@pytest.mark.parametrize("how", ["gc", "close"])
def test_set_deallocation_stream_moves_the_free(device, emu, no_hazards, how):
    """11, 12: after set_deallocation_stream(s2) the free is on s2, by GC or close()."""
    s1, s2 = device.create_stream(), device.create_stream()
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(128, stream=s1)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    s2.wait(s1)
    buf.set_deallocation_stream(s2)
    if how == "gc":
        del buf
        gc.collect()
    else:
        buf.close()
    if emu:
        (free,) = free_calls(emu, alloc)
        assert free["stream"] == s2.handle
    s1.close()
    s2.close()


def test_close_with_stream_is_setter_then_close(device, stream, emu, no_hazards):
    """D4: close(stream=s) frees on s."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(128, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    stream.wait(custody.LEGACY_DEFAULT_STREAM)
    buf.close(stream=stream)
    assert buf.is_closed
    if emu:
        assert free_calls(emu, alloc)[0]["stream"] == stream.handle


def test_setter_rejects_none_and_keeps_the_recipe(device, stream, emu):
    """14, 15, 16: set_deallocation_stream(None) -> TypeError; close(None) keeps the recipe;
    close(stream=object()) -> TypeError and the buffer stays open with its recipe."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    with pytest.raises(TypeError):
        buf.set_deallocation_stream(None)
    with pytest.raises(TypeError):
        buf.close(stream=object())
    assert not buf.is_closed
    buf.close(None)
    if emu:
        assert free_calls(emu, alloc)[0]["stream"] == stream.handle


def test_closed_buffer_rules(device, stream):
    """17, 18 and D4: the setter raises on a closed buffer, close() is a no-op, and close(stream)
    is exactly setter-then-close, so it raises like the setter."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)
    buf.close()
    buf.close()
    with pytest.raises(RuntimeError, match="Buffer has been closed"):
        buf.set_deallocation_stream(stream)
    with pytest.raises(RuntimeError, match="Buffer has been closed"):
        buf.close(stream=stream)
    assert buf.memory_resource is None and buf.owner is None


def test_closed_stream_is_rejected_and_the_old_recipe_stays(device, emu):
    """19: a closed stream -> RuntimeError, recipe unchanged."""
    s1, s2 = device.create_stream(), device.create_stream()
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=s1)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    s2.close()
    with pytest.raises(RuntimeError, match="Stream has been closed"):
        buf.set_deallocation_stream(s2)
    with pytest.raises(RuntimeError, match="Stream has been closed"):
        buf.close(stream=s2)
    assert not buf.is_closed
    buf.close()
    if emu:
        assert free_calls(emu, alloc)[0]["stream"] == s1.handle
    s1.close()


@needs_emulator
def test_a_stream_whose_context_was_destroyed_is_rejected_and_the_old_recipe_stays(device, emu):
    """D4: a wrapped stream whose context its maker destroyed (a context custody does not hold)
    cannot order the free: set_deallocation_stream, close(stream=) and record_use raise and
    leave the old recipe, and close() frees on it (the stream was accepted, close() then failed
    and the memory leaked). Emulator only: a real driver given a destroyed context or stream
    is undefined behaviour (the CUDA documentation of cuCtxDestroy)."""
    ctx = ctypes.c_void_p()
    assert DRIVER.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
    raw = ctypes.c_void_p()
    assert DRIVER.cuStreamCreate(ctypes.byref(raw), 0) == 0
    assert DRIVER.cuCtxPopCurrent_v2(None) == 0
    device.set_current()
    foreign = custody.Stream.from_handle(raw.value)
    s1 = device.create_stream()
    buf = custody.DeviceMemoryResource(0).allocate(64, stream=s1)
    buf.set_deallocation_stream(foreign)  # its context lives: accepted
    buf.set_deallocation_stream(s1)
    alloc = emu.alloc_id(buf.handle)
    assert DRIVER.cuCtxDestroy_v2(ctx) == 0
    with pytest.raises(RuntimeError, match="has been destroyed"):
        buf.set_deallocation_stream(foreign)
    with pytest.raises(RuntimeError, match="has been destroyed"):
        buf.close(stream=foreign)
    with pytest.raises(RuntimeError, match="has been destroyed"):
        buf.record_use(foreign)
    assert not buf.is_closed
    emu.clear_calls()
    buf.close()
    (free,) = free_calls(emu, alloc)
    assert (free["stream"], free["result"]) == (s1.handle, 0)
    s1.close()


def test_setter_without_context_needs_a_created_stream(device, stream):
    """20: with no current context, the legacy token is refused and a created stream works."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)

    def on_thread():
        assert current_context() == 0
        with pytest.raises(RuntimeError, match="no CUDA context is current"):
            buf.set_deallocation_stream(custody.LEGACY_DEFAULT_STREAM)
        buf.set_deallocation_stream(stream)
        buf.close()
        return current_context()

    assert run_in_thread(on_thread) == 0


def test_ptds_env_var_selects_the_default_stream(monkeypatch):
    """38: default_stream() follows CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM, re-read."""
    var = "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"
    monkeypatch.delenv(var, raising=False)
    assert custody.default_stream() is custody.LEGACY_DEFAULT_STREAM
    for value, ptds in [("1", True), ("123foo", True), ("0", False), ("", False), ("x", False)]:
        monkeypatch.setenv(var, value)
        assert (custody.default_stream() is custody.PER_THREAD_DEFAULT_STREAM) == ptds, value
    monkeypatch.delenv(var)
    assert custody.default_stream() is custody.LEGACY_DEFAULT_STREAM


def test_from_handle_default_stream_follows_the_env_var(device, monkeypatch, recorded_warnings):
    """39: from_handle(p, n, mr=...) with the variable set records the per-thread stream of the
    calling thread; dropped on the recording thread, deallocate gets that stream (0x2), on
    another thread the legacy stream of the recorded context (0x1, docs/decisions.md D6), with
    no warning."""
    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    rec = RecordingResource()
    ptr = rec.raw_allocate(64, custody.LEGACY_DEFAULT_STREAM)
    buf = custody.Buffer.from_handle(ptr, 64, mr=rec)

    def drop():
        nonlocal buf
        del buf
        gc.collect()

    run_in_thread(drop)
    assert rec.calls[0]["stream"] == 0x1
    assert [w for w in recorded_warnings if issubclass(w.category, custody.CUDAWarning)] == []
    ptr = rec.raw_allocate(64, custody.LEGACY_DEFAULT_STREAM)
    buf = custody.Buffer.from_handle(ptr, 64, mr=rec)
    del buf
    gc.collect()
    assert rec.calls[1]["stream"] == 0x2


@pytest.mark.skipif(custody.system.num_devices < 2, reason="needs two CUDA devices")
def test_legacy_singleton_does_not_cache_its_context(device, emu):
    """41: LEGACY_DEFAULT_STREAM.context follows the current context; a buffer recorded under A
    still frees under A after B became current."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    a = device.context
    assert custody.LEGACY_DEFAULT_STREAM.context == a
    b = custody.Device(1)
    b.set_current()
    assert custody.LEGACY_DEFAULT_STREAM.context == b.context
    buf.close()
    assert current_context() == b.context.handle
    if emu:
        assert free_calls(emu, alloc)[0]["context"] == a.handle


def test_views_free_nothing(device, stream, emu):
    """45: from_handle(p, n) is a view: closing or collecting it frees nothing, and the setter
    succeeds (it is inert)."""
    mr = custody.DeviceMemoryResource(0)
    owner = mr.allocate(64, stream=stream)
    alloc = emu.alloc_id(owner.handle) if emu else None
    view = custody.Buffer.from_handle(owner.handle, 64)
    assert view.memory_resource is None
    view.set_deallocation_stream(stream)
    view.close()
    view2 = custody.Buffer.from_handle(owner.handle, 64)
    del view2
    gc.collect()
    if emu:
        assert emu.is_live(alloc)
    owner.close()


def test_owner_is_kept_alive_until_close(device):
    """46: owner= adds exactly one reference until close, none after; nothing is freed."""

    class Owner:
        pass

    o = Owner()
    before = sys.getrefcount(o)
    buf = custody.Buffer.from_handle(0x1000, 64, owner=o)
    assert sys.getrefcount(o) == before + 1
    assert buf.owner is o
    buf.close()
    assert sys.getrefcount(o) == before
    assert buf.owner is None


def test_owner_dropped_with_the_buffer_on_another_thread(device):
    """46 (drop path): a buffer dropped on a thread without the GIL-holding caller releases its
    owner too."""
    import weakref

    class Owner:
        pass

    o = Owner()
    ref = weakref.ref(o)
    buf = custody.Buffer.from_handle(0x2000, 8, owner=o)
    del o

    def drop():
        nonlocal buf
        del buf

    run_in_thread(drop)
    gc.collect()
    assert ref() is None


def test_context_manager_closes_and_does_not_swallow(device, stream, emu):
    """74: with mr.allocate(...) as b: raise E -> E propagates and b is closed."""
    mr = custody.DeviceMemoryResource(0)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with mr.allocate(64, stream=stream) as b:
            ptr = b.handle
            alloc = emu.alloc_id(ptr) if emu else None
            raise Boom()
    assert b.is_closed
    if emu:
        assert free_calls(emu, alloc)[0]["stream"] == stream.handle


def test_a_second_holder_sees_the_new_recipe(device, emu):
    """D4: every holder of the allocation (here a DLPack capsule) sees the replaced recipe."""
    s1, s2 = device.create_stream(), device.create_stream()
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=s1)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    capsule = buf.__dlpack__()
    buf.close()
    if emu:
        assert free_calls(emu, alloc) == [], "the capsule still holds the memory"
        assert emu.is_live(alloc)
    # The buffer is closed; a new buffer cannot reach the memory, but the capsule's holder
    # frees it with the recipe last recorded (s1 here).
    del capsule
    gc.collect()
    if emu:
        (free,) = free_calls(emu, alloc)
        assert free["stream"] == s1.handle
    s1.close()
    s2.close()
