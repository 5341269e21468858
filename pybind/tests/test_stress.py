"""Stress, Python side: N threads each doing M random operations (allocate from random
memory resources, a Python one among them, on random streams; fill, copy, read back; hand buffers
to other threads and move frees with ``set_deallocation_stream`` after an event wait; close,
``close(stream=...)``, ``del``, drop on a thread without a context, drop inside a reference
cycle collected by the garbage collector) as a correctly ordered program. Nothing may be lost:
every operation succeeds, no ``CUDAWarning``, bytes read back match, every allocation of the
Python resource is deallocated exactly once, the pools' ``used_mem_current`` is back to its
baseline; on the emulator no hazard (the autouse ``no_hazards`` fixture) and no live allocation
left.

Environment (docs/reliability.md): ``CUSTODY_STRESS_THREADS`` (default 4),
``CUSTODY_STRESS_PY_OPS`` (operations per thread, default 150; 30 under compute-sanitizer,
``CUSTODY_UNDER_COMPUTE_SANITIZER``), ``CUSTODY_STRESS_SECONDS``
(default 20), ``CUSTODY_STRESS_SEED`` (default: from the clock; printed).
"""

from __future__ import annotations

import ctypes
import gc
import os
import queue
import random
import sys
import threading
import time
from collections import Counter

import custody
from conftest import EMU, RecordingResource, cuda_warnings

THREADS = int(os.environ.get("CUSTODY_STRESS_THREADS", "4"))
# Under compute-sanitizer (run.py --sanitizer sets CUSTODY_UNDER_COMPUTE_SANITIZER) every
# driver call is many times slower: fewer operations, as a margin (150 ran past 300 s on the
# H200 while the sanitizer still kept Python frames alive; 30 passed once it no longer did).
UNDER_SANITIZER = "CUSTODY_UNDER_COMPUTE_SANITIZER" in os.environ
OPS = int(os.environ.get("CUSTODY_STRESS_PY_OPS", "30" if UNDER_SANITIZER else "150"))
SECONDS = float(os.environ.get("CUSTODY_STRESS_SECONDS", "20"))
MAX_HELD = 10


class Counting(RecordingResource):
    """conftest's Python memory resource, counting its allocations."""

    def __init__(self):
        super().__init__(0)
        self.allocated = 0

    def allocate(self, size, *, stream):
        with self.lock:
            self.allocated += 1
        return super().allocate(size, stream=stream)


def host_bytes(buf, stream):
    staging = custody.LegacyPinnedMemoryResource().allocate(buf.size, stream=stream)
    staging.copy_from(buf, stream=stream)
    stream.sync()
    data = ctypes.string_at(staging.handle, buf.size)
    staging.close()
    return data


class Held:
    """A buffer one thread holds: all its work is issued on ``stream``, which is also its
    deallocation stream; ``byte`` is what it holds, when known."""

    __slots__ = ("buf", "stream", "byte")

    def __init__(self, buf, stream, byte=None):
        self.buf, self.stream, self.byte = buf, stream, byte


class World:
    def __init__(self, seed, dev):
        self.seed = seed
        self.dev = dev
        self.streams = [dev.create_stream() for _ in range(3)]
        self.python_mr = Counting()
        self.resources = [
            custody.DeviceMemoryResource(0),
            custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions()),
            custody.PinnedMemoryResource(),
            custody.LegacyPinnedMemoryResource(),
            custody.ManagedMemoryResource(),
            custody.SynchronousMemoryResource(0),
            self.python_mr,
        ]
        self.mailboxes = [queue.SimpleQueue() for _ in range(THREADS)]
        self.counts = Counter()
        self.counts_lock = threading.Lock()
        self.deadline = time.monotonic() + SECONDS
        self.errors = []

    def count(self, what):
        with self.counts_lock:
            self.counts[what] += 1


def order(from_stream, to_stream):
    """Everything issued on ``from_stream`` so far comes before what ``to_stream`` does next."""
    to_stream.wait(from_stream.record())


class Worker:
    def __init__(self, world, index):
        self.w = world
        self.index = index
        self.rng = random.Random(world.seed * 1_000_003 + index)
        self.own = world.dev.create_stream()
        self.held = []

    def stream(self):
        return self.rng.choice(self.w.streams + [self.own])

    def take(self):
        if not self.held:
            return None
        return self.held.pop(self.rng.randrange(len(self.held)))

    def keep(self, h):
        self.held.append(h)
        while len(self.held) > MAX_HELD:
            self.take()
            self.w.count("drop (over the limit)")

    def receive(self):
        box = self.w.mailboxes[self.index]
        while True:
            try:
                h, event = box.get_nowait()
            except queue.Empty:
                return
            s = self.stream()
            s.wait(event)
            h.buf.set_deallocation_stream(s)
            h.stream = s
            self.w.count("received")
            self.keep(h)

    def step(self):
        self.receive()
        r = self.rng.randrange(100)
        if r < 24:
            mr = self.rng.choice(self.w.resources)
            s = self.stream()
            size = self.rng.choice([1, 3, 64, 4096, 1 << 16, self.rng.randrange(1, 1 << 14)])
            buf = mr.allocate(size, stream=s)
            assert buf.size == size
            self.keep(Held(buf, s))
            self.w.count("allocate")
        elif r < 36:
            h = self.take()
            if h:
                h.byte = self.rng.randrange(256)
                h.buf.fill(h.byte, stream=h.stream)
                self.keep(h)
                self.w.count("fill")
        elif r < 41:
            h = self.take()
            if h:
                if h.byte is not None and h.buf.size <= 4096:
                    assert host_bytes(h.buf, h.stream) == bytes([h.byte]) * h.buf.size
                    self.w.count("verify")
                self.keep(h)
        elif r < 47:
            h = self.take()
            if h:
                copy = h.buf.copy_to(stream=h.stream)
                self.keep(h)
                self.keep(Held(copy, h.stream, h.byte))
                self.w.count("copy_to")
        elif r < 57:
            h = self.take()
            if h:
                to = self.stream()
                order(h.stream, to)
                h.buf.set_deallocation_stream(to)
                h.stream = to
                self.keep(h)
                self.w.count("set_deallocation_stream after a wait")
        elif r < 67:
            h = self.take()
            if h:
                event = h.stream.record()
                target = self.rng.randrange(len(self.w.mailboxes))
                self.w.mailboxes[target].put((h, event))
                self.w.count("hand off")
        elif r < 76:
            h = self.take()
            if h:
                del h
                self.w.count("del")
        elif r < 83:
            h = self.take()
            if h:
                h.buf.close()
                h.buf.close()
                assert h.buf.is_closed
                self.w.count("close")
        elif r < 88:
            h = self.take()
            if h:
                to = self.stream()
                order(h.stream, to)
                h.buf.close(stream=to)
                self.w.count("close(stream=...) after a wait")
        elif r < 93:
            h = self.take()
            if h:
                t = threading.Thread(target=lambda held=[h]: held.clear())
                del h
                t.start()
                t.join()
                self.w.count("drop on a thread without a context")
        elif r < 97:
            h = self.take()
            if h:
                cycle = [h]
                cycle.append(cycle)
                del cycle, h
                gc.collect()
                self.w.count("drop in the garbage collector")
        else:
            custody.drain_deferred_cleanup()
            self.w.count("drain_deferred_cleanup")

    def finish(self):
        self.receive()
        while self.held:
            h = self.take()
            if self.rng.random() < 0.5:
                to = self.stream()
                order(h.stream, to)
                h.buf.close(stream=to)
            del h


def run_thread(world, index):
    try:
        if index % 2 == 0:
            world.dev.set_current()
        worker = Worker(world, index)
        done = 0
        while done < OPS and time.monotonic() < world.deadline:
            worker.step()
            done += 1
        worker.finish()
        with world.counts_lock:
            world.counts["operations"] += done
    except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
        world.errors.append((index, exc))


def test_random_operations_on_many_threads_lose_nothing(device, recorded_warnings):
    seed = int(os.environ.get("CUSTODY_STRESS_SEED", str(time.time_ns())))
    print(
        f"stress: {THREADS} threads x {OPS} operations, seed {seed} "
        f"(repeat with CUSTODY_STRESS_SEED={seed})",
        file=sys.stderr,
    )
    custody.drain_deferred_cleanup()
    gc.collect()
    device.sync()
    # Identities, not addresses: a pool hands freed addresses out again (docs/driver-facts.md F18).
    baseline_live = EMU.live_ids() if EMU is not None else set()
    default_pool = custody.DeviceMemoryResource(0)
    baseline_used = default_pool.attributes.used_mem_current

    world = World(seed, device)
    own_pool, pinned_pool = world.resources[1], world.resources[2]
    started = time.monotonic()
    threads = [threading.Thread(target=run_thread, args=(world, i)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if world.errors:
        index, exc = world.errors[0]
        raise AssertionError(f"thread {index} failed (seed {seed})") from exc
    for box in world.mailboxes:  # hand-offs to threads that had finished: freed here
        while not box.empty():
            box.get_nowait()
            world.counts["hand-offs dropped after the receiver finished"] += 1

    deadline = time.monotonic() + 60
    while True:
        custody.drain_deferred_cleanup()
        gc.collect()
        device.sync()
        # What the Python resource still holds is live now, so its addresses name it now.
        held = world.python_mr.live.keys()
        done = EMU is None or all(
            a["id"] in baseline_live or a["ptr"] in held for a in EMU.allocations()
        )
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    print(f"stress: {dict(world.counts)} in {elapsed:.2f} s (seed {seed})", file=sys.stderr)

    assert cuda_warnings(recorded_warnings) == [], [str(w.message) for w in recorded_warnings]
    mr = world.python_mr
    assert mr.live == {}, "every Python-resource allocation was deallocated"
    assert len(mr.calls) == mr.allocated, "and exactly once"
    assert default_pool.attributes.used_mem_current == baseline_used
    assert own_pool.attributes.used_mem_current == 0
    assert pinned_pool.attributes.used_mem_current == 0
    if EMU is not None:
        left = [a for a in EMU.allocations() if a["id"] not in baseline_live]
        print(f"stress: emulator: {len(EMU.hazards())} hazards, {len(left)} live allocations left", file=sys.stderr)
        assert left == [], left
    assert world.counts["operations"] > 0
