"""The producer/consumer deallocation-stream example runs, and (on the emulator) every free it
makes is ordered after every use: the hazard checker sees nothing."""

import importlib.util
import os

import custody

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "buffer_deallocation_stream.py")


def load_example():
    spec = importlib.util.spec_from_file_location("buffer_deallocation_stream", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_producer_consumer_example(device, emu, capsys):
    example = load_example()
    example.main(size=1 << 16, rounds=4)
    custody.drain_deferred_cleanup()
    out = capsys.readouterr().out.splitlines()
    assert out == [f"round {i}: consumed 65536 bytes of {i + 1}" for i in range(4)]
    if emu is not None:
        frees = emu.calls_to("cuMemFreeAsync")
        assert len(frees) == 4 and all(f["result"] == 0 for f in frees)
        assert emu.hazards() == []


def test_without_the_hand_off_the_emulator_sees_the_hazard(device, emu):
    """The same flow without set_deallocation_stream frees on the producer while the consumer
    may still read: on the emulator the hazard checker reports exactly that."""
    if emu is None:
        import pytest

        pytest.skip("needs the emulated driver's hazard checker")
    producer, consumer = device.create_stream(), device.create_stream()
    buf = custody.DeviceMemoryResource(0).allocate(4096, stream=producer)
    buf.fill(1, stream=producer)
    consumer.wait(producer)
    host = custody.LegacyPinnedMemoryResource().allocate(4096, stream=consumer)
    host.copy_from(buf, stream=consumer)
    buf.close()  # on the producer: not ordered after the consumer's copy
    consumer.sync()
    host.close()
    kinds = [h["kind"] for h in emu.hazards()]
    emu.clear_hazards()
    assert kinds == ["unordered_free"]
    producer.close()
    consumer.close()
