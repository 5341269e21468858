"""Producer/consumer hand-off: who orders the free of a buffer that moves between streams.

A producer stream fills a device buffer; a consumer stream, told to wait for the producer,
copies it into pinned host memory. The buffer was allocated on the producer, so its free is
recorded on the producer: dropping it there would free memory the consumer may still be reading.
``set_deallocation_stream(consumer)`` hands the free over to the consumer, which orders it after
the copy; ``close(stream=...)`` does the same in one call. Nothing is synchronised by either.

Run: ``python examples/buffer_deallocation_stream.py`` (with ``CUSTODY_CUDA_DRIVER`` pointing at
the emulated driver on a machine without a GPU).
"""

import ctypes

import custody


def main(size: int = 1 << 20, rounds: int = 4) -> None:
    device = custody.Device(0)
    device.set_current()
    producer = device.create_stream()
    consumer = device.create_stream()
    device_mr = custody.DeviceMemoryResource(device)
    pinned_mr = custody.LegacyPinnedMemoryResource()

    for round_ in range(rounds):
        # Produce: allocate and fill on the producer stream.
        buf = device_mr.allocate(size, stream=producer)
        buf.fill(round_ + 1, stream=producer)

        # Consume: the consumer waits for the producer's work, then copies to the host.
        consumer.wait(producer)
        host = pinned_mr.allocate(size, stream=consumer)
        host.copy_from(buf, stream=consumer)

        # Hand the free over to the consumer: it runs after the copy, not after the fill only.
        if round_ % 2 == 0:
            buf.set_deallocation_stream(consumer)
            del buf  # freed (stream-ordered on the consumer) wherever the last reference goes
        else:
            buf.close(stream=consumer)

        consumer.sync()
        data = ctypes.string_at(host.handle, size)
        assert data == bytes([round_ + 1]) * size, f"round {round_}: wrong bytes"
        host.close()
        print(f"round {round_}: consumed {size} bytes of {round_ + 1}")

    producer.close()
    consumer.close()


if __name__ == "__main__":
    main()
