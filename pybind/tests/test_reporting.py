"""Failing loudly (docs/decisions.md D3): explicit closes raise, drops report a custody.CUDAWarning,
escalated warnings go to sys.unraisablehook, nothing escapes a drop (docs/reference-notes.md section
5, scenarios 27, 28, 30-34, 49)."""

import gc
import sys
import warnings

import pytest

import custody
from conftest import (
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_INVALID_VALUE,
    RecordingResource,
    clear_current,
    cuda_warnings,
    current_context,
    needs_emulator,
    run_in_thread,
)


@needs_emulator
def test_two_failed_frees_are_two_distinct_warnings(device, emu):
    """30: each failed free is its own CUDAWarning naming cuMemFreeAsync(0x<ptr>), even under the
    default filter (not collapsed by the warning registry)."""
    mr = custody.DeviceMemoryResource(0)
    buffers = [mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM) for _ in range(2)]
    pointers = [b.handle for b in buffers]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        while buffers:
            emu.inject_fault("cuMemFreeAsync", 1, CUDA_ERROR_INVALID_VALUE)
            buffers.pop(0)
    messages = [str(w.message) for w in cuda_warnings(caught)]
    assert len(messages) == 2, messages
    for ptr, message in zip(pointers, messages):
        assert f"cuMemFreeAsync(0x{ptr:x})" in message
        assert "CUDA_ERROR_INVALID_VALUE" in message


@needs_emulator
def test_deinitialized_is_silent(device, emu, recorded_warnings):
    """31: CUDA_ERROR_DEINITIALIZED from a free is not reported."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    before = custody._custody._cleanup_report_counts()[0]
    emu.inject_fault("cuMemFreeAsync", 1, CUDA_ERROR_DEINITIALIZED)
    del buf
    gc.collect()
    assert cuda_warnings(recorded_warnings) == []
    assert custody._custody._cleanup_report_counts()[0] == before


@needs_emulator
def test_exception_in_flight_survives_a_reported_failure(device, emu, recorded_warnings):
    """32: a failing free released while an exception propagates: the exception is unchanged and
    the warning is still emitted."""
    mr = custody.DeviceMemoryResource(0)

    class Boom(Exception):
        pass

    def body():
        buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
        emu.inject_fault("cuMemFreeAsync", 1, CUDA_ERROR_INVALID_VALUE)
        raise Boom("original")  # buf dies with this frame while Boom propagates

    with pytest.raises(Boom, match="original") as info:
        body()
    del info
    gc.collect()
    assert len(cuda_warnings(recorded_warnings)) == 1


@needs_emulator
def test_explicit_close_raises_and_closes(device, emu, recorded_warnings):
    """33, decided by D3: an explicit close whose free fails raises CUDAError naming the call and
    the error; the buffer is closed either way; nothing is reported as a warning."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    emu.inject_fault("cuMemFreeAsync", 1, CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(custody.CUDAError) as info:
        buf.close()
    assert isinstance(info.value, RuntimeError)
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE" and info.value.code == 1
    assert "cuMemFreeAsync" in str(info.value) and "CUDA_ERROR_INVALID_VALUE" in str(info.value)
    assert buf.is_closed
    buf.close()
    assert cuda_warnings(recorded_warnings) == []


@needs_emulator
def test_explicit_deallocate_raises(device, stream, emu):
    """34: an explicit mr.deallocate the driver refuses raises CUDAError (never treated as
    success)."""
    mr = custody.DeviceMemoryResource(0)
    with pytest.raises(custody.CUDAError, match="CUDA_ERROR_INVALID_VALUE"):
        emu.inject_fault("cuMemFreeAsync", 1, CUDA_ERROR_INVALID_VALUE)
        mr.deallocate(0x1234, 16, stream=stream)


@needs_emulator
def test_escalated_warning_goes_to_unraisablehook(device, emu, monkeypatch):
    """28: with CUDAWarning escalated to an error and sys.unraisablehook replaced, a failing free
    on drop gives exactly one unraisable record of type CUDAWarning; the process continues."""
    records = []
    monkeypatch.setattr(sys, "unraisablehook", records.append)
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    with warnings.catch_warnings():
        warnings.simplefilter("error", custody.CUDAWarning)
        emu.inject_fault("cuMemFreeAsync", 1, CUDA_ERROR_INVALID_VALUE)
        del buf
        gc.collect()
    assert len(records) == 1
    assert records[0].exc_type is custody.CUDAWarning
    assert f"0x{ptr:x}" in str(records[0].exc_value)


@needs_emulator
def test_failed_restore_is_reported(device, emu, recorded_warnings):
    """27: a context restore that fails after the free is reported (naming cuCtxSetCurrent) and
    nothing escapes the drop."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    holder = [buf]
    del buf

    def drop():
        emu.inject_fault("cuCtxSetCurrent", 2, CUDA_ERROR_INVALID_VALUE)
        holder.clear()
        left = current_context()
        from conftest import clear_current

        clear_current()
        return left

    left = run_in_thread(drop)
    assert left == device.context.handle, "the failed restore left the recipe context current"
    warned = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert len(warned) == 1 and "cuCtxSetCurrent" in warned[0], warned


@needs_emulator
def test_worker_free_failure_is_reported(device, emu, recorded_warnings):
    """A synchronous free that fails on the cleanup worker is reported as a CUDAWarning."""
    mr = custody.LegacyPinnedMemoryResource()
    buf = mr.allocate(256, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    emu.inject_fault("cuMemFreeHost", 1, CUDA_ERROR_INVALID_VALUE)
    del buf
    custody.drain_deferred_cleanup()
    warned = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert len(warned) == 1 and f"cuMemFreeHost(0x{ptr:x})" in warned[0], warned


@pytest.mark.parametrize("where", ["this thread", "another thread"])
def test_python_deallocate_raising_is_one_warning(device, recorded_warnings, where):
    """A Python MR whose deallocate raises: on a drop, one CUDAWarning naming the resource and
    the exception; nothing escapes."""
    rec = RecordingResource(fail=ValueError("boom"))
    buf = rec.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    holder = [buf]
    del buf
    if where == "this thread":
        holder.clear()
        gc.collect()
    else:
        run_in_thread(holder.clear)
    warned = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert len(warned) == 1, warned
    assert "RecordingResource.deallocate" in warned[0] and "boom" in warned[0]
    assert f"0x{ptr:x}" in warned[0]
    assert len(rec.calls) == 1
    rec.release_all()


def test_python_deallocate_raising_on_explicit_close_reraises(device):
    """D3: an explicit close re-raises what the Python deallocate raised; the buffer is closed."""
    rec = RecordingResource(fail=ValueError("boom"))
    buf = rec.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    with pytest.raises(ValueError, match="boom"):
        buf.close()
    assert buf.is_closed
    rec.release_all()


def test_keyboard_interrupt_in_deallocate_is_reported(device, recorded_warnings):
    """49, decided by D3: a BaseException (KeyboardInterrupt) from deallocate during a drop is
    reported like any failure, not left to escape."""
    rec = RecordingResource(fail=KeyboardInterrupt())
    buf = rec.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    del buf
    gc.collect()
    warned = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert len(warned) == 1 and "KeyboardInterrupt" in warned[0], warned
    rec.release_all()


def test_cudawarning_is_a_runtime_warning():
    assert issubclass(custody.CUDAWarning, RuntimeWarning)
    assert issubclass(custody.CUDAError, RuntimeError)


def _no_rust_names(text: str):
    assert "::" not in text and "Deallocator" not in text, text


def test_python_deallocate_failure_names_the_python_class(device, recorded_warnings):
    """A drop whose Python deallocate raised: the CUDAWarning names the resource by its Python
    class (not an internal Rust item), the operation, the exception and the consequence."""
    rec = RecordingResource(fail=ValueError("boom"))
    buf = rec.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    del buf
    gc.collect()
    (message,) = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert message.startswith(f"deallocate(0x{ptr:x}) [RecordingResource]"), message
    assert "ValueError: boom" in message and "leaked" in message, message
    _no_rust_names(message)
    rec.release_all()


@needs_emulator
def test_activation_failure_on_drop_says_it_leaked(device, emu, recorded_warnings):
    """A drop whose recipe context cannot be made current: the warning names the Python class,
    says the activation failed and that the memory was leaked; deallocate was not called."""
    rec = RecordingResource()
    buf = rec.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    holder = [buf]
    del buf

    def drop():
        emu.inject_fault("cuCtxSetCurrent", 1, CUDA_ERROR_INVALID_CONTEXT)
        holder.clear()
        return current_context()

    assert run_in_thread(drop) == 0
    (message,) = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert message.startswith(f"deallocate(0x{ptr:x}) [RecordingResource]"), message
    assert "making its context current failed" in message, message
    assert "CUDA_ERROR_INVALID_CONTEXT" in message and "leaked" in message, message
    _no_rust_names(message)
    assert rec.calls == []
    rec.release_all()


@needs_emulator
@pytest.mark.parametrize("resource", ["pool", "python"])
def test_close_whose_restore_failed_says_the_free_succeeded(device, emu, resource):
    """An explicit close whose free succeeded but whose restore of the caller's context failed
    raises a CUDAError that says so (freed; the caller's context not restored, which one is
    current); the buffer is closed and the memory is not freed twice."""
    rec = RecordingResource() if resource == "python" else None
    mr = rec if rec is not None else custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr)
    a = device.context.handle

    def close():
        emu.inject_fault("cuCtxSetCurrent", 2, CUDA_ERROR_INVALID_CONTEXT)
        try:
            buf.close()
        except custody.CUDAError as error:
            left = current_context()
            clear_current()
            return error, left
        raise AssertionError("the failed restore was not raised")

    error, left = run_in_thread(close)
    text = str(error)
    operation = "deallocate" if rec is not None else "cuMemFreeAsync"
    assert text.startswith(f"{operation} succeeded, but"), text
    assert "was not restored" in text and f"0x{a:x} is still current" in text, text
    assert error.name == "CUDA_ERROR_INVALID_CONTEXT" and error.code == CUDA_ERROR_INVALID_CONTEXT
    assert left == a
    assert buf.is_closed
    if rec is not None:
        assert [c["ptr"] for c in rec.calls] == [ptr]
        rec.release_all()
    else:
        assert len(emu.calls_to("cuMemFreeAsync", alloc=alloc)) == 1
