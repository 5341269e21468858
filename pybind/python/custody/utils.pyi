"""cuda.core 1.2's ``cuda.core.utils`` names that custody provides: :class:`StridedMemoryView`
(a strided array's pointer, shape, strides, dtype and device, read from any DLPack,
``__cuda_array_interface__`` or ``__array_interface__`` producer, or laid over a
:class:`~custody.Buffer`), :func:`args_viewable_as_strided_memory`, and the managed-memory batch
functions :func:`prefetch_batch`, :func:`discard_batch` and :func:`discard_prefetch_batch`.

A view keeps its producer alive (the object, and the DLPack tensor it exported, whose deleter
runs when the last view over it goes) and follows each protocol's stream rules: the consumer
stream it is given is passed to the producer's ``__dlpack__``, or, for the CUDA Array Interface,
made to wait for the producer's stream (an event, no host wait). A custody buffer viewed with a
consumer stream also declares that stream a use of its memory (``Buffer.record_use``), so its
free waits for the consumer's work.
"""

from typing import Any, Callable, Optional, Tuple

from custody import Buffer, discard_batch as discard_batch, discard_prefetch_batch as discard_prefetch_batch, prefetch_batch as prefetch_batch
from custody._layout import _StridedLayout

class StridedMemoryView:
    """A strided array's memory as a device-agnostic view: its pointer, shape, strides, dtype
    and device, with a reference that keeps the producer alive.

    Made with :meth:`from_dlpack`, :meth:`from_cuda_array_interface`,
    :meth:`from_array_interface`, :meth:`from_any_interface` (DLPack when the object has it,
    else the CUDA Array Interface), :meth:`from_buffer` (a :class:`~custody.Buffer` with a
    shape), or :func:`args_viewable_as_strided_memory`. ``StridedMemoryView(obj, stream_ptr)``
    does what :meth:`from_any_interface` does and warns that this form is deprecated
    (``DeprecationWarning``), as in cuda.core 1.2.

    The consumer stream ``stream_ptr`` is an int: a stream's handle (``Stream.handle``),
    ``1``/``2`` for the legacy/per-thread default stream, or ``-1`` for no ordering at all.
    DLPack passes it to the producer's ``__dlpack__`` (``-1`` included; ``0`` is passed as
    ``None``), which orders the consumer after its work; the CUDA Array Interface makes the
    consumer stream wait for an event recorded on the producer's ``stream`` (``-1``: no event).
    A custody :class:`~custody.Buffer` viewed with a consumer stream makes that stream wait for
    its deallocation stream and declares it a use of the memory (``Buffer.record_use``), so the
    buffer's free, wherever it happens, waits for the consumer's work; ``-1`` does neither.
    ``stream_ptr=None`` is a ``BufferError`` for host and device memory ("ambiguous"), and
    passed through for pinned and managed memory.

    Attributes (read-only): ``ptr`` (the address of the element at index ``(0,) * ndim``, an
    int), ``device_id`` (-1 for host memory), ``is_device_accessible``, ``readonly`` and
    ``exporting_obj`` (the object viewed; for :meth:`from_buffer`, the buffer).
    """
    def __init__(self, obj: Any = None, stream_ptr: Optional[int] = None) -> None:
        ...
    @classmethod
    def from_dlpack(cls, obj: Any, stream_ptr: Optional[int] = None) -> "StridedMemoryView":
        """A view of ``obj``'s DLPack export (``obj.__dlpack__``, asked for a versioned tensor of
        DLPack 1.x and else an unversioned one), with ``stream_ptr`` passed to the producer as
        the consumer stream (see the class). The view keeps the tensor (its deleter runs when
        the last view over it goes) and ``obj``. ``BufferError`` for a device other than the
        host, a CUDA device, pinned or managed memory, or for ``stream_ptr=None`` with host or
        device memory; ``TypeError`` for a non-int stream; what the producer raises.
        """
    @classmethod
    def from_cuda_array_interface(cls, obj: Any, stream_ptr: Optional[int] = None) -> "StridedMemoryView":
        """A view of ``obj.__cuda_array_interface__`` (version 3 or later), keeping ``obj``.
        Unless ``stream_ptr`` is -1, the consumer stream waits for an event recorded on the
        interface's ``stream`` (no host wait; nothing when the interface names none or the
        same stream); a custody :class:`~custody.Buffer` also declares the consumer stream a
        use (see the class). ``BufferError`` for a version below 3, a ``mask``, a ``stream`` of
        0 or ``stream_ptr=None``; ``ValueError`` for strides that are not whole elements;
        :class:`~custody.CUDAError` when the driver refuses the event or the wait.
        """
    @classmethod
    def from_array_interface(cls, obj: Any) -> "StridedMemoryView":
        """A view of host memory through ``obj.__array_interface__`` (version 3 or later, NumPy's
        protocol), keeping ``obj``. ``device_id`` is the current context's device, as in
        cuda.core 1.2, and ``is_device_accessible`` False. ``BufferError`` for a version below 3
        or a ``mask``; ``ValueError`` for strides that are not whole elements.
        """
    @classmethod
    def from_any_interface(cls, obj: Any, stream_ptr: Optional[int] = None) -> "StridedMemoryView":
        """:meth:`from_dlpack` when ``obj`` has ``__dlpack__`` and ``__dlpack_device__``, else
        :meth:`from_cuda_array_interface`; ``RuntimeError`` when it has neither.
        """
    @classmethod
    def from_buffer(
        cls,
        buffer: Buffer,
        shape: Tuple[int, ...],
        strides: Optional[Tuple[int, ...]] = None,
        *,
        itemsize: Optional[int] = None,
        dtype: Any = None,
        is_readonly: bool = False,
    ) -> "StridedMemoryView":
        """A view of ``buffer``'s memory with ``shape`` and ``strides`` (in elements; None for C
        order) of ``dtype`` items, or of ``itemsize``-byte items with no dtype. Nothing is
        synchronised: order the view's use after the buffer's work yourself.

        ``ValueError`` when neither ``itemsize`` nor ``dtype`` is given, they disagree, or the
        layout needs more bytes than the buffer has (checked for a buffer whose size is known:
        one a resource allocated, or a ``from_handle`` view of more than 0 bytes) or reaches
        before its start; ``TypeError`` for a non-buffer.
        """
    @property
    def ptr(self) -> int:
        """The address of the element at index ``(0,) * ndim``, an int."""
    @property
    def device_id(self) -> int:
        """The device the memory belongs to; -1 for host memory."""
    @property
    def is_device_accessible(self) -> bool:
        """Whether a device can access the memory (device, pinned or managed memory)."""
    @property
    def readonly(self) -> bool:
        """Whether the producer marked the memory read-only."""
    @property
    def exporting_obj(self) -> Any:
        """The object viewed (for :meth:`from_buffer`, the buffer), kept alive by the view."""
    @property
    def _layout(self) -> _StridedLayout:
        """The view's :class:`_StridedLayout` (shape, strides, item size, slice offset)."""
    @property
    def size(self) -> int:
        """The number of elements."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape, a tuple of ints."""
    @property
    def strides(self) -> Optional[Tuple[int, ...]]:
        """The strides in elements (not bytes), or None for a C-contiguous tensor whose producer
        gave none.
        """
    @property
    def dtype(self) -> Any:
        """The NumPy dtype of the elements (None for a :meth:`from_buffer` view made with an
        ``itemsize`` only). bfloat16 tensors need the ``ml_dtypes`` package
        (``NotImplementedError`` without it).
        """
    def view(self, layout: Optional[_StridedLayout] = None, dtype: Any = None) -> "StridedMemoryView":
        """A view of the same memory with another layout (its ``slice_offset`` counted from this
        view's ``ptr`` less this view's own offset, as cuda.core does) and/or dtype; this view
        itself when neither is given. It keeps what this view keeps. ``ValueError`` when the
        dtype's item size is not the layout's, or the layout does not fit a buffer of known
        size.
        """
    def copy_from(self, other: "StridedMemoryView", stream: Any, allocator: Any = None, blocking: Optional[bool] = None) -> None:
        """Not provided (cuda.core 1.2 does not implement it either): ``NotImplementedError``."""
    def copy_to(self, other: "StridedMemoryView", stream: Any = None, allocator: Any = None, blocking: Optional[bool] = None) -> None:
        """Not provided (cuda.core 1.2 does not implement it either): ``NotImplementedError``."""
    def as_tensor_map(
        self,
        box_dim: Optional[Tuple[int, ...]] = None,
        *,
        options: Any = None,
        element_strides: Optional[Tuple[int, ...]] = None,
        data_type: Any = None,
        interleave: Any = None,
        swizzle: Any = None,
        l2_promotion: Any = None,
        oob_fill: Any = None,
    ) -> Any:
        """Not provided: tensor maps are kernel arguments, outside custody's scope
        (``NotImplementedError``).
        """
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)`` of the memory: the producer's own for a DLPack view;
        else the driver's answer for device-accessible memory (device, pinned or managed) and
        ``(kDLCPU, 0)`` for host memory. ``BufferError`` for memory neither side can access.
        """
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule of this view (versioned, DLPack 1.x, when ``max_version`` is at least
        ``(1, 0)``, with the read-only flag of :attr:`readonly`; else unversioned), whose tensor
        keeps this view, and so the producer, alive until its deleter runs. ``stream`` is
        accepted and not used: nothing is synchronised, as in cuda.core 1.2. ``dl_device`` may
        name the view's own device (a consumer asking for it), as for a ``Buffer``.
        ``BufferError`` for another ``dl_device``, ``copy=True``, a malformed ``max_version``, a view without a dtype or
        with one DLPack has no code for.
        """

def args_viewable_as_strided_memory(arg_indices: Tuple[int, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator that replaces the positional arguments at ``arg_indices`` (a tuple of ints)
    with proxies whose ``view(stream_ptr)`` gives their :class:`StridedMemoryView`, so that the
    function body reads any DLPack or CUDA Array Interface producer the same way::

        @args_viewable_as_strided_memory((0,))
        def scale(arr, stream):
            view = arr.view(stream.handle)
            ...

    ``RuntimeError`` at the call for an argument that supports neither protocol.
    """
