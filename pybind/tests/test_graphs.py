"""Graph-retained buffers and deferred cleanup, graph memory and capture (docs/reference-notes.md
section 5, scenarios 22, 37, 52, 53, 58, 69, 70; docs/decisions.md D6, D7)."""

import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import pytest

import custody
from conftest import (
    cuda_warnings,
    current_context,
    drain_until,
    run_in_parked_thread,
    run_in_thread,
)


def read(ptr, size, stream):
    """The bytes at a device pointer (through a view and pinned staging memory)."""
    view = custody.Buffer.from_handle(ptr, size)
    staging = custody.LegacyPinnedMemoryResource().allocate(size, stream=stream)
    staging.copy_from(view, stream=stream)
    stream.sync()
    data = ctypes.string_at(staging.handle, size)
    staging.close()
    view.close()
    return data


def test_graph_keeps_a_closed_buffer_alive_and_drain_frees_it(device, stream, emu):
    """52, 53: a captured fill retains the buffer; closing it frees nothing; the graph still
    writes valid memory; once graph and executable are gone the free runs in the recipe's
    context, from a drain on a thread with no context, which has none afterwards."""
    pool = custody.DeviceMemoryResource(0)
    buf = pool.allocate(4096, stream=stream)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    gb = device.create_graph_builder()
    assert isinstance(gb.stream, custody.Stream)
    gb.begin_building()
    assert gb.is_building
    buf.fill(0x42, stream=gb)
    gb.end_building()
    graph = gb.complete()
    stream.sync()
    buf.close()
    assert buf.is_closed
    if emu:
        assert emu.calls_to("cuMemFreeAsync", alloc=alloc) == []
        assert emu.is_live(alloc)
    graph.launch(stream)
    assert read(ptr, 4096, stream) == b"\x42" * 4096
    graph.close()
    gb.close()
    gc.collect()

    def drain():
        custody.drain_deferred_cleanup()
        return current_context()

    assert run_in_thread(drain) == 0
    if emu:
        drain_until(lambda: not emu.is_live(alloc))
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        # D2: a created stream's free makes no context current (the draining thread has none).
        assert free["context"] == 0 and free["result"] == 0
        assert not emu.is_live(alloc)


def test_set_deallocation_stream_to_a_builder_records_its_stream(device, stream, emu):
    """22: set_deallocation_stream(gb) records the builder's stream."""
    pool = custody.DeviceMemoryResource(0)
    buf = pool.allocate(64, stream=stream)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    gb = device.create_graph_builder()
    gb.stream.wait(stream)
    buf.set_deallocation_stream(gb)
    buf.close()
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == gb.stream.handle
    gb.close()


def test_ptds_buffer_retained_by_a_graph_is_freed_on_the_legacy_stream(
    device, stream, emu, no_hazards, recorded_warnings
):
    """37, decided by D6: a buffer whose free is on the per-thread default stream of a worker
    thread, used there without a synchronisation and retained by a graph, is freed by the drain
    on another thread on the legacy stream of its context, which waits for the worker's
    per-thread stream (docs/driver-facts.md F14): no warning when the graph retains it or when
    it is freed, and no unordered free."""
    pool = custody.DeviceMemoryResource(0)
    base = pool.attributes.used_mem_current

    def allocate():
        device.set_current()
        buf = pool.allocate(256, stream=custody.PER_THREAD_DEFAULT_STREAM)
        buf.fill(3, stream=custody.PER_THREAD_DEFAULT_STREAM)  # not synchronised
        # The graph launch below is on another stream, which nothing else orders after this
        # thread's per-thread stream (F15): it waits for this event, or it would use the memory
        # before its allocation (the hazard checker's use_before_alloc).
        return buf, custody.PER_THREAD_DEFAULT_STREAM.record()

    # The worker stays alive, parked, until the free is done: it must not end with its fill
    # pending on its per-thread stream (docs/driver-facts.md F24).
    (buf, made), worker = run_in_parked_thread(device, allocate)
    alloc = emu.alloc_id(buf.handle) if emu else None
    gb = device.create_graph_builder()
    gb.begin_building()
    buf.fill(1, stream=gb)
    gb.end_building()
    graph = gb.complete()
    stream.wait(made)
    graph.launch(stream)
    stream.sync()
    buf.close()
    graph.close()
    gb.close()

    def freed():
        device.sync()
        return pool.attributes.used_mem_current == base

    assert drain_until(freed)
    worker.finish()
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == 0x1 and free["context"] == device.context.handle
        assert free["result"] == 0


def test_graph_memory_resource_under_capture(device, stream, emu):
    """69: a graph allocation's recipe is the capturing stream; closing it during the capture
    adds a free to the graph; the graph runs."""
    gmr = custody.GraphMemoryResource(0)
    gb = device.create_graph_builder()
    gb.begin_building()
    buf = gmr.allocate(1024, stream=gb)
    assert buf.memory_resource is gmr
    buf.fill(3, stream=gb)
    buf.close()
    gb.end_building()
    graph = gb.complete()
    graph.launch(stream)
    stream.sync()
    if emu:
        frees = emu.calls_to("cuMemFreeAsync")
        assert [f["stream"] for f in frees] == [gb.stream.handle]
    graph.close()
    gb.close()


def test_graph_allocation_closed_before_the_first_launch_is_freed_after_it(device, emu):
    """A graph allocation not freed in its capture has no memory until the graph runs: closing
    it between ``end_building()`` and the first launch succeeds and frees nothing yet; the
    launch then frees it on its recipe's stream, after the launch (docs/decisions.md D11)."""
    gmr = custody.GraphMemoryResource(0)
    gb = device.create_graph_builder()
    gb.begin_building()
    buf = gmr.allocate(64, stream=gb)
    buf.fill(3, stream=gb)
    ptr = buf.handle
    gb.end_building()
    if emu:
        emu.clear_calls()
    buf.close()
    assert buf.handle == 0
    if emu:
        assert emu.calls_to("cuMemFreeAsync") == []
    graph = gb.complete()
    launch_stream = device.create_stream()
    graph.launch(launch_stream)
    launch_stream.sync()
    gb.stream.sync()
    if emu:
        frees = emu.calls_to("cuMemFreeAsync", ptr)
        assert [(f["stream"], f["result"]) for f in frees] == [(gb.stream.handle, 0)]
        assert ptr not in emu.live_pointers()
        assert emu.hazards() == []
    graph.close()
    gb.close()
    launch_stream.close()


def test_another_graphs_allocation_closed_during_a_capture_is_kept_and_freed_once(
    device, stream, emu
):
    """A graph allocation of a first graph, launched, closed while its stream is
    captured into a second graph, is not the second graph's free node (never launched, the free
    would be lost; launched twice, it would be two frees): the second graph keeps the memory,
    launches any number of times, and once it and its executable are gone the memory is freed
    once."""
    gmr = custody.GraphMemoryResource(0)
    gb1 = stream.create_graph_builder().begin_building()
    g = gmr.allocate(4096, stream=gb1)
    g.fill(1, stream=gb1)
    gb1.end_building()
    g1 = gb1.complete()
    g1.launch(stream)
    stream.sync()
    alloc = emu.alloc_id(g.handle) if emu else None
    other = custody.DeviceMemoryResource(0).allocate(64, stream=stream)
    stream.sync()
    gb2 = stream.create_graph_builder().begin_building()
    other.fill(2, stream=gb2)
    if emu:
        emu.clear_calls()
    g.close()
    if emu:
        assert emu.calls_to("cuMemFreeAsync", alloc=alloc) == []
    gb2.end_building()
    g2 = gb2.complete()
    g2.launch(stream)
    g2.launch(stream)
    stream.sync()
    if emu:
        assert emu.is_live(alloc), "the second graph keeps it"
        assert emu.hazards() == []
    g2.close()
    gb2.close()
    assert drain_until(lambda: emu is None or not emu.is_live(alloc))
    stream.sync()
    if emu:
        frees = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert [(f["stream"], f["result"]) for f in frees] == [(stream.handle, 0)]
    g1.close()
    gb1.close()
    other.close()


def test_a_graph_allocation_used_on_a_forked_stream_is_freed_in_the_graph(device, stream, emu):
    """A graph allocation with a declared use on a stream forked into the same
    capture, the fork joined, closed inside the capture: the free is a free node after the use,
    and the graph launches as often as the user likes (the second launch failed with
    CUDA_ERROR_INVALID_VALUE: the free had been kept for the graph's close)."""
    gmr = custody.GraphMemoryResource(0)
    b = device.create_stream()
    out = custody.DeviceMemoryResource(0).allocate(4096, stream=stream)
    stream.sync()
    gb = stream.create_graph_builder().begin_building()
    g = gmr.allocate(4096, stream=gb)
    g.fill(1, stream=gb)
    b.wait(gb.stream)
    gb.retain(out)
    out.copy_from(g, stream=b)
    g.record_use(b)
    gb.stream.wait(b)
    g.close()
    gb.end_building()
    graph = gb.complete()
    for _ in range(3):
        graph.launch(stream)
        stream.sync()
    assert read(out.handle, 4096, stream) == b"\x01" * 4096
    graph.close()
    gb.close()
    out.close()
    b.close()


def test_a_graph_that_does_not_free_its_allocation_is_not_launched_again(device, stream, emu):
    """docs/decisions.md D11: a graph whose capture allocated memory it does
    not free allocates it again at every launch, and nothing would own that memory: after its
    first launch, launching it again raises RuntimeError before any driver call (it allocated
    memory nobody freed, silently)."""
    gmr = custody.GraphMemoryResource(0)
    gb = stream.create_graph_builder().begin_building()
    g = gmr.allocate(4096, stream=gb)
    g.fill(1, stream=gb)
    ptr = g.handle
    gb.end_building()
    graph = gb.complete()
    graph.launch(stream)
    stream.sync()
    g.close()
    stream.sync()
    if emu:
        emu.clear_calls()
    with pytest.raises(RuntimeError, match="launched once"):
        graph.launch(stream)
    stream.sync()
    if emu:
        assert emu.calls_to("cuGraphLaunch") == []
        assert ptr not in emu.live_pointers()
    graph.close()
    gb.close()


@pytest.mark.parametrize("end", ["close", "invalidate"])
@pytest.mark.parametrize("free", ["close", "drop"])
def test_an_allocation_of_a_discarded_capture_frees_nothing(
    device, stream, emu, recorded_warnings, end, free
):
    """A graph allocation of a capture that was discarded (the builder closed
    while building) or invalidated by the driver never had memory: closing or dropping it
    frees nothing and says nothing false (close raised CUDAError INVALID_VALUE and the checker
    saw a double free; a drop warned "has leaked"). ``complete()`` after the invalidated
    capture says so."""
    gmr = custody.GraphMemoryResource(0)
    gb = stream.create_graph_builder().begin_building("thread_local")
    t = gmr.allocate(4096, stream=gb)
    ptr = t.handle
    if end == "close":
        gb.close()
    else:
        event = gb.stream.record()
        with pytest.raises(custody.CUDAError):
            event.is_done
        with pytest.raises(custody.CUDAError, match="INVALIDATED"):
            gb.end_building()
        with pytest.raises(RuntimeError, match="invalidated"):
            gb.complete()
    if emu:
        emu.clear_calls()
    if free == "close":
        t.close()
    else:
        del t
        gc.collect()
    custody.drain_deferred_cleanup()
    stream.sync()
    assert [str(w.message) for w in cuda_warnings(recorded_warnings)] == []
    if emu:
        assert emu.calls_to("cuMemFreeAsync", ptr) == []
    if end != "close":
        gb.close()


def test_pool_allocation_while_capturing_is_refused(device):
    """70: DeviceMemoryResource.allocate on a capturing builder -> RuntimeError pointing at
    GraphMemoryResource."""
    gb = device.create_graph_builder()
    gb.begin_building()
    with pytest.raises(RuntimeError, match="consider using GraphMemoryResource"):
        custody.DeviceMemoryResource(0).allocate(64, stream=gb)
    gb.end_building()
    gb.close()


def test_close_raises_when_the_capture_cannot_be_ended_and_can_be_retried(device, emu):
    """An explicit ``close()`` that cannot end the capture raises ``CUDAError`` (as other
    explicit closes do) and leaves the builder open and building; closing again ends it."""
    if emu is None:
        pytest.skip("needs the emulated driver's fault injection")
    gb = device.create_graph_builder()
    gb.begin_building("thread_local")
    emu.inject_fault("cuStreamEndCapture", 1, 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(custody.CUDAError, match="cuStreamEndCapture"):
        gb.close()
    assert not gb.is_closed and gb.is_building
    gb.close()
    assert gb.is_closed
    gb.close()  # idempotent


def test_close_of_an_invalidated_capture_is_not_an_error(device):
    """A capture that an unsupported call invalidated (an event recorded in the capture, queried
    on the capturing thread: docs/driver-facts.md F17) has ended all the same: ``close()``
    succeeds, and the stream runs work again."""
    gb = device.create_graph_builder()
    gb.begin_building("thread_local")
    event = gb.stream.record()
    with pytest.raises(custody.CUDAError):
        event.is_done
    gb.close()
    assert gb.is_closed
    buf = custody.DeviceMemoryResource(0).allocate(64, stream=gb.stream)
    buf.fill(3, stream=gb.stream)
    gb.stream.sync()
    buf.close()


def test_a_builder_dropped_while_its_capture_cannot_be_ended_warns(tmp_path):
    """A builder dropped (never closed) whose capture cannot be ended reports that as a
    ``CUDAWarning`` through the cleanup hook, as other drops do, not as a bare line on stderr.
    In a child process: the capture it leaves running is the child's last act."""
    from conftest import EMU

    if EMU is None:
        pytest.skip("needs the emulated driver's fault injection")
    script = textwrap.dedent(
        """
        import gc, sys, warnings
        sys.path.insert(0, {tests!r})
        import custody
        from conftest import EMU

        dev = custody.Device(0)
        dev.set_current()
        gb = dev.create_graph_builder()
        stream = gb.stream
        gb.begin_building("thread_local")
        EMU.inject_fault("cuStreamEndCapture", 1, 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del gb
            gc.collect()
        found = [str(w.message) for w in caught if issubclass(w.category, custody.CUDAWarning)]
        print(len(found))
        for text in found:
            print(text)
        """
    ).format(tests=os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "1", out.stdout + out.stderr
    assert lines[1].startswith("cuStreamEndCapture(0x") and "[stream capture]" in lines[1], lines
    assert "CUDA_ERROR_INVALID_VALUE" in lines[1], lines
    assert lines[1].endswith("the stream is still being captured: its work is recorded, not run, "
                             "and what the capture recorded and retained is kept until the "
                             "capture ends"), lines
    assert "ending the capture of a dropped graph builder failed" not in out.stderr, out.stderr


def test_builder_bad_input(device):
    gb = device.create_graph_builder()
    with pytest.raises(ValueError, match="capture mode"):
        gb.begin_building("bogus")
    with pytest.raises(RuntimeError, match="end_building"):
        gb.complete()
    with pytest.raises(RuntimeError, match="not building"):
        gb.end_building()
    gb.begin_building()
    with pytest.raises(RuntimeError, match="already building"):
        gb.begin_building()
    gb.end_building()
    graph = gb.complete()
    with pytest.raises(TypeError):
        graph.launch(None)
    graph.close()
    graph.close()
    with pytest.raises(RuntimeError, match="Graph has been closed"):
        graph.launch(custody.LEGACY_DEFAULT_STREAM)
    gb.close()
    with pytest.raises(RuntimeError, match="Graph builder has been closed"):
        gb.begin_building()
    with pytest.raises(RuntimeError, match="cannot be instantiated"):
        custody.GraphBuilder()


def test_exit_with_graph_cleanup_queued():
    """58: graph-retained buffers whose cleanup is queued when the interpreter exits: a clean
    exit, no hang."""
    script = textwrap.dedent(
        """
        import custody
        dev = custody.Device(0)
        dev.set_current()
        s = dev.create_stream()
        pool = custody.DeviceMemoryResource(0)
        graphs = []
        for _ in range(8):
            buf = pool.allocate(256, stream=s)
            gb = dev.create_graph_builder()
            gb.begin_building()
            buf.fill(1, stream=gb)
            gb.end_building()
            g = gb.complete()
            g.launch(s)
            buf.close()
            graphs.append((gb, g))
        for gb, g in graphs:
            g.close()
            gb.close()
        print("exiting")
        """
    )
    # PYTHONFAULTHANDLER: an abort at exit (seen once, under compute-sanitizer on the H200:
    # "FATAL: exception not rethrown", docs/gpu-validation.md) then dumps every thread's Python
    # stack into the failure's stderr.
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert "Traceback" not in out.stderr, out.stderr


# -------------------------------------------------------------------------------------------
# Explicit keep-alives for work custody does not see: a kernel another library
# launched on the captured stream. Here a copy issued on ``gb.stream`` (a plain Stream, not the
# builder) stands in for it: captured, and retaining nothing, as a foreign launch does. The CuPy
# test at the end runs a real foreign kernel on a GPU.

SIZE = 4096
PATTERN = bytes((i * 7 + 3) % 256 for i in range(SIZE))


def write(buf, data, stream):
    """Writes ``data`` into ``buf`` through pinned staging memory."""
    staging = custody.LegacyPinnedMemoryResource().allocate(len(data), stream=stream)
    ctypes.memmove(staging.handle, data, len(data))
    buf.copy_from(staging, stream=stream)
    stream.sync()
    staging.close()


def used(mr, stream):
    """The pool's used memory in bytes once the work queued on ``stream`` has run."""
    stream.sync()
    return mr.attributes.used_mem_current


def own_pool():
    """A resource with a pool of its own: only this test changes its used memory."""
    return custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())


def record_foreign_read(device, src, out, retain):
    """A builder whose capture reads ``src`` into ``out`` with work custody does not see;
    ``retain`` decides whether the builder is told to keep ``src``. Returns (builder, graph)."""
    gb = device.create_graph_builder()
    gb.begin_building()
    src.copy_to(out, stream=gb.stream)  # issued on the stream, not the builder: retains nothing
    if retain:
        gb.retain(src)
        gb.retain(src)  # twice: harmless
    gb.end_building()
    return gb, gb.complete()


def launch_and_check(graph, out, stream, expected=PATTERN):
    for launch in range(3):
        out.fill(0, stream=stream)
        graph.launch(stream)
        assert read(out.handle, SIZE, stream) == expected, f"launch {launch}"


def test_builder_retain_keeps_a_closed_buffer_for_captured_foreign_work(
    device, stream, emu, recorded_warnings
):
    """The capture retains ``src``; the user closes it; every launch reads the right bytes; the
    memory is freed once, in deferred cleanup, after the builder and the graph are closed."""
    mr = own_pool()
    out = mr.allocate(SIZE, stream=stream)
    used_by_out = used(mr, stream)
    src = mr.allocate(SIZE, stream=stream)
    write(src, PATTERN, stream)
    alloc = emu.alloc_id(src.handle) if emu else None
    used_by_both = used(mr, stream)

    gb, graph = record_foreign_read(device, src, out, retain=True)
    src.close()
    assert used(mr, stream) == used_by_both, "closing a retained buffer frees nothing"
    if emu:
        assert emu.is_live(alloc)
    launch_and_check(graph, out, stream)
    gb.close()  # the recorded graph goes; the executable holds what it inherited
    custody.drain_deferred_cleanup()
    launch_and_check(graph, out, stream)
    assert used(mr, stream) == used_by_both
    if emu:
        assert emu.is_live(alloc)
        assert emu.hazards() == []
        assert emu.calls_to("cuMemFreeAsync", alloc=alloc) == []

    graph.close()
    assert drain_until(lambda: used(mr, stream) == used_by_out)
    assert cuda_warnings(recorded_warnings) == [], "nothing was reported"
    if emu:
        assert not emu.is_live(alloc)
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)  # retained twice, freed once
        assert free["result"] == 0 and free["stream"] == stream.handle
    out.close()
    mr.close()


def test_graph_retain_keeps_a_closed_buffer_until_the_executable_goes(
    device, stream, emu, recorded_warnings
):
    """``Graph.retain`` (on the executable): launches queued before it are covered; the free
    runs on the stream set by ``set_deallocation_stream`` before the close, once the graph is
    closed, while the builder's recorded graph (which never retained it) is still open."""
    mr = own_pool()
    other = device.create_stream()
    out = mr.allocate(SIZE, stream=stream)
    used_by_out = used(mr, stream)
    src = mr.allocate(SIZE, stream=stream)
    write(src, PATTERN, stream)
    alloc = emu.alloc_id(src.handle) if emu else None
    used_by_both = used(mr, stream)

    gb, graph = record_foreign_read(device, src, out, retain=False)
    out.fill(0, stream=stream)
    graph.launch(stream)
    graph.retain(src)
    graph.retain(src)  # twice: held once
    src.set_deallocation_stream(other)
    src.close()
    assert read(out.handle, SIZE, stream) == PATTERN
    assert used(mr, stream) == used_by_both
    launch_and_check(graph, out, stream)
    if emu:
        assert emu.is_live(alloc)
        assert emu.hazards() == []

    graph.close()
    assert drain_until(lambda: used(mr, other) == used_by_out)
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["result"] == 0 and free["stream"] == other.handle
    gb.close()
    out.close()
    other.close()
    mr.close()


@pytest.mark.expect_hazards("use_after_free")
def test_without_retain_the_checker_sees_the_graph_read_freed_memory(device, stream, emu):
    """The negative control of the two tests above: without ``retain`` the close frees the
    memory and the launch reads freed memory, which the emulator's hazard checker reports."""
    if emu is None:
        pytest.skip(
            "needs the emulator's hazard checker: on a real driver the launch would read freed "
            "memory"
        )
    mr = own_pool()
    out = mr.allocate(SIZE, stream=stream)
    used_by_out = used(mr, stream)
    src = mr.allocate(SIZE, stream=stream)
    write(src, PATTERN, stream)
    alloc = emu.alloc_id(src.handle)
    gb, graph = record_foreign_read(device, src, out, retain=False)
    src.close()
    assert used(mr, stream) == used_by_out, "nothing kept it: freed at close"
    graph.launch(stream)
    stream.sync()
    assert [h["alloc"] for h in emu.hazards() if h["kind"] == "use_after_free"] == [alloc]
    graph.close()
    gb.close()
    out.close()
    mr.close()


def test_retain_bad_input_is_refused_and_changes_nothing(device, stream, emu):
    """TypeError for a non-buffer and None; RuntimeError for a builder not building, a closed
    buffer, a closed builder, a closed graph; no driver call and no retention in any case."""
    mr = own_pool()
    buf = mr.allocate(SIZE, stream=stream)
    closed_buf = mr.allocate(SIZE, stream=stream)
    closed_buf.close()
    gb = device.create_graph_builder()
    gb.begin_building()
    gb.end_building()
    graph = gb.complete()
    if emu:
        emu.clear_calls()
    for bad in (None, 17, stream, bytearray(8)):
        with pytest.raises(TypeError, match="Buffer expected"):
            gb.retain(bad)
        with pytest.raises(TypeError, match="Buffer expected"):
            graph.retain(bad)
    with pytest.raises(RuntimeError, match="not building"):
        gb.retain(buf)
    if emu:
        assert emu.calls() == [], "no driver call"
    gb.begin_building()
    if emu:
        emu.clear_calls()
    with pytest.raises(RuntimeError, match="Buffer has been closed"):
        gb.retain(closed_buf)
    with pytest.raises(RuntimeError, match="Buffer has been closed"):
        graph.retain(closed_buf)
    if emu:
        assert emu.calls() == [], "no driver call"
    gb.end_building()
    graph.close()
    with pytest.raises(RuntimeError, match="Graph has been closed"):
        graph.retain(buf)
    gb.close()
    with pytest.raises(RuntimeError, match="Graph builder has been closed"):
        gb.retain(buf)
    # Nothing holds the buffer: closing it frees it now.
    buf.close()
    assert used(mr, stream) == 0
    mr.close()


CUPY_KERNEL = r"""
extern "C" __global__ void twice_plus_one(const unsigned int* src, unsigned int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = src[i] * 2u + 1u;
    }
}
"""


def test_a_cupy_kernel_captured_on_a_custody_stream_reads_a_retained_buffer(
    device, stream, emu, recorded_warnings
):
    """A real foreign kernel: CuPy's RawKernel, launched on the builder's stream (a CuPy
    ExternalStream of its handle) during a thread-local capture, reads a custody buffer the
    builder retains; the user closes the buffer; every launch of the graph computes the right
    result; the memory is freed once the graph is gone (the pool's used memory is back, nothing
    reported). A second buffer kept alive only by ``Graph.retain`` covers the executable's own
    attachment the same way."""
    if emu is not None:
        pytest.skip("needs a GPU: the emulator does not run kernels")
    try:
        import cupy
        import numpy
    except ImportError as error:
        pytest.skip(f"needs CuPy for a foreign kernel: {error}")
    import struct

    n = SIZE // 4
    words = [(i * 2654435761) & 0xFFFF_FFFF for i in range(n)]
    source = struct.pack(f"<{n}I", *words)
    expected = struct.pack(f"<{n}I", *[(w * 2 + 1) & 0xFFFF_FFFF for w in words])
    mr = own_pool()
    out = mr.allocate(SIZE, stream=stream)
    used_by_out = used(mr, stream)
    src = mr.allocate(SIZE, stream=stream)
    write(src, source, stream)
    used_by_both = used(mr, stream)

    kernel = cupy.RawKernel(CUPY_KERNEL, "twice_plus_one")
    try:
        # Compiles (NVRTC) and loads the module outside the capture.
        kernel.compile()
    except Exception as error:  # noqa: BLE001 - any compiler problem: the host cannot run it
        pytest.skip(f"CuPy cannot compile a kernel on this host: {error!r}")
    threads = 128
    blocks = (n + threads - 1) // threads

    def launch_on(custody_stream, src_ptr, out_ptr):
        # Raw addresses as 64-bit scalars: CuPy holds no reference to custody's memory.
        with cupy.cuda.ExternalStream(custody_stream.handle, 0):
            args = (numpy.uint64(src_ptr), numpy.uint64(out_ptr), numpy.int32(n))
            kernel((blocks,), (threads,), args)

    # The kernel on a plain stream first: what every graph launch must reproduce.
    launch_on(stream, src.handle, out.handle)
    assert read(out.handle, SIZE, stream) == expected

    gb = device.create_graph_builder()
    gb.begin_building()  # thread_local, the builder's default
    launch_on(gb.stream, src.handle, out.handle)
    gb.retain(src)
    gb.end_building()
    graph = gb.complete()
    gb.close()
    src.close()
    custody.drain_deferred_cleanup()
    assert used(mr, stream) == used_by_both, "closing the retained buffer freed nothing"
    launch_and_check(graph, out, stream, expected)
    graph.close()
    assert drain_until(lambda: used(mr, stream) == used_by_out), "freed after the graph went"

    # The executable's own attachment, with the same kernel.
    src = mr.allocate(SIZE, stream=stream)
    write(src, source, stream)
    gb = device.create_graph_builder()
    gb.begin_building()
    launch_on(gb.stream, src.handle, out.handle)
    gb.end_building()
    graph = gb.complete()
    gb.close()
    graph.retain(src)
    src.close()
    custody.drain_deferred_cleanup()
    assert used(mr, stream) == used_by_both
    launch_and_check(graph, out, stream, expected)
    graph.close()
    assert drain_until(lambda: used(mr, stream) == used_by_out)
    assert cuda_warnings(recorded_warnings) == [], "nothing was reported"
    out.close()
    mr.close()


def test_a_refused_end_building_changes_nothing(device, stream):
    """``end_building()`` on a builder that is not building is refused (``RuntimeError``) and
    leaves the builder as it was: the graph recorded by the capture before it still completes
    and launches, and a builder that never built still says it has not finished building (not
    that a capture was invalidated)."""
    mr = custody.DeviceMemoryResource(device.device_id)
    buf = mr.allocate(256, stream=stream)
    builder = stream.create_graph_builder()
    builder.begin_building()
    buf.fill(0x3C, stream=builder)
    builder.end_building()
    with pytest.raises(RuntimeError, match="not building"):
        builder.end_building()
    graph = builder.complete()
    graph.launch(stream)
    assert read(buf.handle, 256, stream) == b"\x3c" * 256
    graph.close()
    builder.close()
    buf.close()

    fresh = stream.create_graph_builder()
    with pytest.raises(RuntimeError, match="not building"):
        fresh.end_building()
    with pytest.raises(RuntimeError, match="has not finished building"):
        fresh.complete()
    fresh.close()


@pytest.mark.parametrize("kind", ["pool", "synchronous"])
def test_buffers_of_another_stream_freed_while_building_are_freed_and_the_graph_completes(
    device, stream, emu, kind
):
    """F27: beside a global capture (``begin_building("global")``), a free on a stream
    that is not being captured is refused in the driver's default interaction mode, and breaks
    the capture. Custody relaxes the freeing thread's mode around its frees while a capture it
    began runs: a buffer closed on the building thread and one dropped on another thread are
    freed, and the graph completes and runs."""
    pool = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    target = pool.allocate(256, stream=stream)
    if kind == "pool":
        mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    else:
        mr = custody.SynchronousMemoryResource(0)
    other = device.create_stream()
    closed = mr.allocate(4096, stream=other)
    dropped = [mr.allocate(4096, stream=other)]
    allocs = [emu.alloc_id(b.handle) for b in (closed, dropped[0])] if emu else []
    other.sync()
    gb = device.create_graph_builder().begin_building("global")
    target.fill(1, stream=gb)
    closed.close()

    def drop():
        dropped.clear()
        gc.collect()

    run_in_thread(drop)
    target.fill(2, stream=gb)
    gb.end_building()
    graph = gb.complete()
    graph.launch(stream)
    assert read(target.handle, 256, stream) == b"\x02" * 256
    other.sync()
    if kind == "pool":
        assert mr.attributes.used_mem_current == 0, "both frees were made"
    if emu:
        drain_until(lambda: not any(emu.is_live(a) for a in allocs))
        free = "cuMemFreeAsync" if kind == "pool" else "cuMemFree_v2"
        for alloc in allocs:
            assert [c["result"] for c in emu.calls_to(free, alloc=alloc)] == [0]
    graph.close()
    gb.close()
    target.close()
