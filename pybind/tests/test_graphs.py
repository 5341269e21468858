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
from conftest import cuda_warnings, current_context, drain_until, run_in_thread


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


@pytest.mark.expect_hazards("unordered_free")
def test_ptds_buffer_retained_by_a_graph_warns_at_attach(device, stream, recorded_warnings):
    """37, decided by D6: a buffer whose free is on the per-thread default stream of a worker
    warns when a graph retains it (cuda.core did not), and again when the drain frees it on
    another thread."""
    pool = custody.DeviceMemoryResource(0)

    def allocate():
        device.set_current()
        return pool.allocate(256, stream=custody.PER_THREAD_DEFAULT_STREAM)

    buf = run_in_thread(allocate)
    custody.PER_THREAD_DEFAULT_STREAM.sync()
    gb = device.create_graph_builder()
    gb.begin_building()
    buf.fill(1, stream=gb)
    attach = [w for w in cuda_warnings(recorded_warnings) if "retained by a graph" in str(w.message)]
    assert len(attach) == 1
    gb.end_building()
    graph = gb.complete()
    graph.launch(stream)
    stream.sync()
    buf.close()
    graph.close()
    gb.close()

    def others():
        return [w for w in cuda_warnings(recorded_warnings) if "ran on thread" in str(w.message)]

    drain_until(lambda: others())
    assert len(others()) == 1


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


def test_pool_allocation_while_capturing_is_refused(device):
    """70: DeviceMemoryResource.allocate on a capturing builder -> RuntimeError pointing at
    GraphMemoryResource."""
    gb = device.create_graph_builder()
    gb.begin_building()
    with pytest.raises(RuntimeError, match="consider using GraphMemoryResource"):
        custody.DeviceMemoryResource(0).allocate(64, stream=gb)
    gb.end_building()
    gb.close()


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
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert "Traceback" not in out.stderr, out.stderr
