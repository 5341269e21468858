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

from __future__ import annotations

import functools
import operator
import warnings
from typing import Any, Callable, Optional, Tuple

from custody import (
    Buffer,
    Device,
    DLDeviceType,
    Stream,
    discard_batch,
    discard_prefetch_batch,
    prefetch_batch,
)
from custody import _custody
from custody._layout import _StridedLayout

try:
    from ml_dtypes import bfloat16
except ImportError:
    bfloat16 = None

__all__ = [
    "StridedMemoryView",
    "args_viewable_as_strided_memory",
    "discard_batch",
    "discard_prefetch_batch",
    "prefetch_batch",
]

# The DLPack version a view asks producers for (``max_version``), as cuda.core 1.2 does.
_DLPACK_MAX_VERSION = (1, 3)

# DLPack's data type codes.
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6

_CPU, _CUDA, _CUDA_HOST, _CUDA_MANAGED = (
    int(DLDeviceType.kDLCPU),
    int(DLDeviceType.kDLCUDA),
    int(DLDeviceType.kDLCUDAHost),
    int(DLDeviceType.kDLCUDAManaged),
)


def _numpy():
    try:
        import numpy
    except ImportError:
        raise ImportError("StridedMemoryView's dtypes are NumPy dtypes: install numpy") from None
    return numpy


def _dtype_of_dlpack(code, bits, lanes):
    """The NumPy dtype of DLPack's ``(code, bits, lanes)``."""
    if lanes != 1:
        raise NotImplementedError(f"vector dtypes (lanes={lanes}) are not supported")
    if code == _DL_BFLOAT:
        if bfloat16 is None:
            raise NotImplementedError(
                "bfloat16 tensors need the ml_dtypes package: a view requires `ml_dtypes` for "
                "their dtype"
            )
        return _numpy().dtype(bfloat16)
    names = {
        _DL_INT: ("int", (8, 16, 32, 64)),
        _DL_UINT: ("uint", (8, 16, 32, 64)),
        _DL_FLOAT: ("float", (16, 32, 64)),
        _DL_COMPLEX: ("complex", (64, 128)),
        _DL_BOOL: ("bool", (8,)),
    }
    if code not in names:
        raise TypeError(f"Unsupported dtype. dtype code: {code}")
    name, widths = names[code]
    if bits not in widths:
        raise TypeError(f"{name}{bits} is not supported")
    return _numpy().dtype("bool" if name == "bool" else f"{name}{bits}")


def _dlpack_of_dtype(dtype):
    """DLPack's ``(code, bits, lanes)`` of a NumPy dtype (``BufferError`` for one DLPack has no
    code for)."""
    dtype = _numpy().dtype(dtype)
    if dtype.fields is not None:
        raise BufferError("Structured dtypes are not supported for DLPack export")
    if dtype.byteorder not in ("=", "|") and not dtype.isnative:
        raise BufferError("Non-native-endian dtypes are not supported for DLPack export")
    bits = dtype.itemsize * 8
    if bfloat16 is not None and dtype == _numpy().dtype(bfloat16):
        return _DL_BFLOAT, bits, 1
    widths = {"b": (_DL_BOOL, (8,)), "i": (_DL_INT, (8, 16, 32, 64)),
              "u": (_DL_UINT, (8, 16, 32, 64)), "f": (_DL_FLOAT, (16, 32, 64)),
              "c": (_DL_COMPLEX, (64, 128))}
    if dtype.kind not in widths or bits not in widths[dtype.kind][1]:
        raise BufferError(f"Unsupported dtype for DLPack export: {dtype}")
    return widths[dtype.kind][0], bits, 1


@functools.lru_cache
def _dtype_of_typestr(typestr):
    return _numpy().dtype(typestr)


def _current_device_id():
    return Device().device_id


def _stream_int(stream_ptr, what):
    try:
        return operator.index(stream_ptr)
    except TypeError:
        raise TypeError(f"{what} is an int (a stream's handle, or -1), got {stream_ptr!r}") from None


def _attribute(slot: str, doc: str) -> Any:
    """A read-only property reading ``slot`` (typed ``Any`` so that the annotation beside it is
    the property's type)."""
    return property(operator.attrgetter(slot), doc=doc)


def _check_has_dlpack(obj):
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return True
    if hasattr(obj, "__cuda_array_interface__"):
        return False
    raise RuntimeError("the input object does not support any data exchange protocol")


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

    __slots__ = (
        "_ptr",
        "_device_id",
        "_is_device_accessible",
        "_readonly",
        "_exporting_obj",
        "_keep",
        "_layout_cache",
        "_layout_source",
        "_dtype_cache",
        "_dtype_source",
        "_dl_device",
        "_buffer",
        "__weakref__",
    )

    def __init__(self, obj: Any = None, stream_ptr: Optional[int] = None) -> None:
        clsname = type(self).__name__
        self._init_empty()
        if obj is None:
            warnings.warn(
                f"Constructing an empty {clsname} is deprecated; use one of the classmethods "
                "`from_dlpack`, `from_cuda_array_interface` or `from_any_interface` to construct "
                "a StridedMemoryView from an object",
                DeprecationWarning,
                stacklevel=2,
            )
            return
        if _check_has_dlpack(obj):
            warnings.warn(
                f"Constructing a {clsname} directly from a DLPack-supporting object is "
                "deprecated; Use `StridedMemoryView.from_dlpack` or "
                "`StridedMemoryView.from_any_interface` instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            _view_as_dlpack(self, obj, stream_ptr)
        else:
            warnings.warn(
                f"Constructing a {clsname} directly from a CUDA-array-interface-supporting "
                "object is deprecated; Use `StridedMemoryView.from_cuda_array_interface` or "
                "`StridedMemoryView.from_any_interface` instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            _view_as_cai(self, obj, stream_ptr)

    def _init_empty(self):
        self._ptr = 0
        self._device_id = -1
        self._is_device_accessible = False
        self._readonly = False
        self._exporting_obj = None
        self._keep = None
        self._layout_cache = None
        self._layout_source = None
        self._dtype_cache = None
        self._dtype_source = None
        self._dl_device = None
        self._buffer = None

    @classmethod
    def _new(cls):
        view = cls.__new__(cls)
        view._init_empty()
        return view

    @classmethod
    def from_dlpack(cls, obj: Any, stream_ptr: Optional[int] = None) -> StridedMemoryView:
        """A view of ``obj``'s DLPack export (``obj.__dlpack__``, asked for a versioned tensor of
        DLPack 1.x and else an unversioned one), with ``stream_ptr`` passed to the producer as
        the consumer stream (see the class). The view keeps the tensor (its deleter runs when
        the last view over it goes) and ``obj``. ``BufferError`` for a device other than the
        host, a CUDA device, pinned or managed memory, or for ``stream_ptr=None`` with host or
        device memory; ``TypeError`` for a non-int stream; what the producer raises."""
        view = cls._new()
        _view_as_dlpack(view, obj, stream_ptr)
        return view

    @classmethod
    def from_cuda_array_interface(
        cls, obj: Any, stream_ptr: Optional[int] = None
    ) -> StridedMemoryView:
        """A view of ``obj.__cuda_array_interface__`` (version 3 or later), keeping ``obj``.
        Unless ``stream_ptr`` is -1, the consumer stream waits for an event recorded on the
        interface's ``stream`` (no host wait; nothing when the interface names none or the
        same stream); a custody :class:`~custody.Buffer` also declares the consumer stream a
        use (see the class). ``BufferError`` for a version below 3, a ``mask``, a ``stream`` of
        0 or ``stream_ptr=None``; ``ValueError`` for strides that are not whole elements;
        :class:`~custody.CUDAError` when the driver refuses the event or the wait."""
        view = cls._new()
        _view_as_cai(view, obj, stream_ptr)
        return view

    @classmethod
    def from_array_interface(cls, obj: Any) -> StridedMemoryView:
        """A view of host memory through ``obj.__array_interface__`` (version 3 or later, NumPy's
        protocol), keeping ``obj``. ``device_id`` is the current context's device, as in
        cuda.core 1.2, and ``is_device_accessible`` False. ``BufferError`` for a version below 3
        or a ``mask``; ``ValueError`` for strides that are not whole elements."""
        view = cls._new()
        data = obj.__array_interface__
        _check_interface(data, "NumPy Array Interface")
        view._ptr, view._readonly = _data_pair(data)
        view._is_device_accessible = False
        view._device_id = _current_device_id()
        view._exporting_obj = obj
        view._keep = (obj,)
        view._layout_cache = _layout_of_interface(data)
        view._dtype_source = ("typestr", data["typestr"])
        return view

    @classmethod
    def from_any_interface(cls, obj: Any, stream_ptr: Optional[int] = None) -> StridedMemoryView:
        """:meth:`from_dlpack` when ``obj`` has ``__dlpack__`` and ``__dlpack_device__``, else
        :meth:`from_cuda_array_interface`; ``RuntimeError`` when it has neither."""
        if _check_has_dlpack(obj):
            return cls.from_dlpack(obj, stream_ptr)
        return cls.from_cuda_array_interface(obj, stream_ptr)

    @classmethod
    def from_buffer(cls, buffer: Buffer, shape: Tuple[int, ...],
                    strides: Optional[Tuple[int, ...]] = None, *, itemsize: Optional[int] = None,
                    dtype: Any = None, is_readonly: bool = False) -> StridedMemoryView:
        """A view of ``buffer``'s memory with ``shape`` and ``strides`` (in elements; None for C
        order) of ``dtype`` items, or of ``itemsize``-byte items with no dtype. Nothing is
        synchronised: order the view's use after the buffer's work yourself.

        ``ValueError`` when neither ``itemsize`` nor ``dtype`` is given, they disagree, or the
        layout needs more bytes than the buffer has (checked for a buffer whose size is known:
        one a resource allocated, or a ``from_handle`` view of more than 0 bytes) or reaches
        before its start; ``TypeError`` for a non-buffer."""
        if itemsize is None and dtype is None:
            raise ValueError("Either itemsize or dtype must be specified")
        if dtype is not None:
            dtype = _numpy().dtype(dtype)
            if itemsize is not None and itemsize != dtype.itemsize:
                raise ValueError(
                    f"itemsize ({itemsize}) does not match dtype.itemsize ({dtype.itemsize})"
                )
        layout = _StridedLayout(shape, strides, dtype.itemsize if dtype is not None else itemsize)
        view = cls._new()
        _view_buffer_strided(view, buffer, layout, dtype, is_readonly)
        return view

    # -- attributes (read-only) --

    ptr: int = _attribute("_ptr", "The address of the element at index ``(0,) * ndim``, an int.")
    device_id: int = _attribute(
        "_device_id", "The device the memory belongs to; -1 for host memory."
    )
    is_device_accessible: bool = _attribute(
        "_is_device_accessible",
        "Whether a device can access the memory (device, pinned or managed memory).",
    )
    readonly: bool = _attribute("_readonly", "Whether the producer marked the memory read-only.")
    exporting_obj: Any = _attribute(
        "_exporting_obj",
        "The object viewed (for :meth:`from_buffer`, the buffer), kept alive by the view.",
    )

    @property
    def _layout(self) -> _StridedLayout:
        """The view's :class:`_StridedLayout` (shape, strides, item size, slice offset)."""
        if self._layout_cache is None:
            if self._layout_source is None:
                raise ValueError("Cannot infer layout from the exporting object")
            shape, strides, itemsize = self._layout_source
            self._layout_cache = _StridedLayout(shape, strides, itemsize)
        return self._layout_cache

    @property
    def size(self) -> int:
        """The number of elements."""
        return self._layout.volume

    @property
    def shape(self) -> Tuple[int, ...]:
        """The shape, a tuple of ints."""
        return self._layout.shape

    @property
    def strides(self) -> Optional[Tuple[int, ...]]:
        """The strides in elements (not bytes), or None for a C-contiguous tensor whose producer
        gave none."""
        return self._layout.strides

    @property
    def dtype(self) -> Any:
        """The NumPy dtype of the elements (None for a :meth:`from_buffer` view made with an
        ``itemsize`` only). bfloat16 tensors need the ``ml_dtypes`` package
        (``NotImplementedError`` without it)."""
        if self._dtype_cache is None and self._dtype_source is not None:
            kind, value = self._dtype_source
            if kind == "dlpack":
                self._dtype_cache = _dtype_of_dlpack(*value)
            else:
                self._dtype_cache = _dtype_of_typestr(value)
        return self._dtype_cache

    # -- derived views --

    def view(self, layout: Optional[_StridedLayout] = None, dtype: Any = None) -> StridedMemoryView:
        """A view of the same memory with another layout (its ``slice_offset`` counted from this
        view's ``ptr`` less this view's own offset, as cuda.core does) and/or dtype; this view
        itself when neither is given. It keeps what this view keeps. ``ValueError`` when the
        dtype's item size is not the layout's, or the layout does not fit a buffer of known
        size."""
        if layout is None and dtype is None:
            return self
        if layout is None:
            layout = self._layout
        if dtype is None:
            dtype = self.dtype
        view = type(self)._new()
        if isinstance(self._exporting_obj, Buffer) and self._buffer is not None:
            _view_buffer_strided(view, self._buffer, layout, dtype, self._readonly)
            return view
        if dtype is not None:
            dtype = _numpy().dtype(dtype)
            _check_itemsize(dtype, layout)
        base = self._ptr - self._layout.slice_offset_in_bytes
        view._ptr = base + layout.slice_offset_in_bytes
        view._device_id = self._device_id
        view._is_device_accessible = self._is_device_accessible
        view._readonly = self._readonly
        view._exporting_obj = self._exporting_obj
        view._keep = self._keep
        view._dl_device = self._dl_device
        view._layout_cache = layout
        view._dtype_cache = dtype
        return view

    def copy_from(
        self,
        other: StridedMemoryView,
        stream: Any,
        allocator: Any = None,
        blocking: Optional[bool] = None,
    ) -> None:
        """Not provided (cuda.core 1.2 does not implement it either): ``NotImplementedError``."""
        raise NotImplementedError("Sorry, not supported: copy_from")

    def copy_to(
        self,
        other: StridedMemoryView,
        stream: Any = None,
        allocator: Any = None,
        blocking: Optional[bool] = None,
    ) -> None:
        """Not provided (cuda.core 1.2 does not implement it either): ``NotImplementedError``."""
        raise NotImplementedError("Sorry, not supported: copy_to")

    def as_tensor_map(self, box_dim: Optional[Tuple[int, ...]] = None, *, options: Any = None,
                      element_strides: Optional[Tuple[int, ...]] = None, data_type: Any = None,
                      interleave: Any = None, swizzle: Any = None, l2_promotion: Any = None,
                      oob_fill: Any = None) -> Any:
        """Not provided: tensor maps are kernel arguments, outside custody's scope
        (``NotImplementedError``)."""
        raise NotImplementedError(
            "custody does not provide tensor maps: they are kernel arguments, outside its scope"
        )

    # -- DLPack export --

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)`` of the memory: the producer's own for a DLPack view;
        else the driver's answer for device-accessible memory (device, pinned or managed) and
        ``(kDLCPU, 0)`` for host memory. ``BufferError`` for memory neither side can access."""
        if self._dl_device is not None:
            return self._dl_device
        if isinstance(self._exporting_obj, Buffer):
            kind, ordinal = self._exporting_obj.__dlpack_device__()
        elif not self._is_device_accessible:
            kind, ordinal = _CPU, 0
        else:
            kind, ordinal = _custody._dlpack_device_of_pointer(self._ptr)
        if kind != _CUDA:
            ordinal = 0
        self._dl_device = (int(kind), int(ordinal))
        return self._dl_device

    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of this view (versioned, DLPack 1.x, when ``max_version`` is at least
        ``(1, 0)``, with the read-only flag of :attr:`readonly`; else unversioned), whose tensor
        keeps this view, and so the producer, alive until its deleter runs. ``stream`` is
        accepted and not used: nothing is synchronised, as in cuda.core 1.2. ``dl_device`` may
        name the view's own device (a consumer asking for it), as for a ``Buffer``.
        ``BufferError`` for another ``dl_device``, ``copy=True``, a malformed ``max_version``, a view without a dtype or
        with one DLPack has no code for."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("Sorry, not supported: dl_device other than None or the view's own")
        if copy is True:
            raise BufferError("Sorry, not supported: copy=True")
        if max_version is None:
            versioned = False
        else:
            if not isinstance(max_version, tuple) or len(max_version) != 2:
                raise BufferError(f"Expected max_version tuple[int, int], got {max_version}")
            versioned = max_version >= (1, 0)
        dtype = self.dtype
        if dtype is None:
            raise BufferError(
                "Cannot export StridedMemoryView via DLPack without dtype information; "
                "create the view with dtype specified."
            )
        code = _dlpack_of_dtype(dtype)
        layout = self._layout
        kind, ordinal = self.__dlpack_device__()
        strides = layout.strides
        if strides is None and layout.ndim:
            strides = layout._effective_strides
        ptr = 0 if layout.volume == 0 else self._ptr
        return _custody._dlpack_export(
            self, ptr, (kind, ordinal), layout.shape, strides, code, self._readonly, versioned
        )

    def __repr__(self) -> str:
        try:
            dtype = self.dtype
        except Exception:  # a bfloat16 view without ml_dtypes still has a repr
            dtype = "?"
        return (
            f"StridedMemoryView(ptr={self._ptr},\n"
            f"                  shape={self.shape},\n"
            f"                  strides={self.strides},\n"
            f"                  itemsize={self._layout.itemsize},\n"
            f"                  dtype={_simple_repr(dtype)},\n"
            f"                  device_id={self._device_id},\n"
            f"                  is_device_accessible={self._is_device_accessible},\n"
            f"                  readonly={self._readonly},\n"
            f"                  exporting_obj={_simple_repr(self._exporting_obj)})"
        )


def _simple_repr(obj):
    cls = obj if isinstance(obj, type) else type(obj)
    if cls.__module__ in (None, "builtins"):
        return cls.__name__
    return f"{cls.__module__}.{cls.__name__}"


def _check_interface(data, name):
    if data["version"] < 3:
        raise BufferError(f"only {name} v3 or above is supported")
    if data.get("mask") is not None:
        raise BufferError("mask is not supported")


def _data_pair(data):
    ptr, readonly = data["data"]
    return operator.index(ptr), bool(readonly)


def _layout_of_interface(data):
    """The layout an array interface describes (its strides are in bytes)."""
    itemsize = _dtype_of_typestr(data["typestr"]).itemsize
    return _StridedLayout(tuple(data["shape"]), data.get("strides"), itemsize, divide_strides=True)


def _check_itemsize(dtype, layout):
    if dtype.itemsize != layout.itemsize:
        raise ValueError(
            f"The dtype's itemsize ({dtype.itemsize}) does not match the layout's "
            f"itemsize ({layout.itemsize})."
        )


def _view_buffer_strided(view, buffer, layout, dtype, readonly):
    if not isinstance(buffer, Buffer):
        raise TypeError(f"Buffer expected, got {type(buffer).__name__}")
    if dtype is not None:
        dtype = _numpy().dtype(dtype)
        _check_itemsize(dtype, layout)
    size = buffer.size
    if buffer.memory_resource is not None or size > 0:
        needed = layout.required_size_in_bytes()
        if size < needed:
            raise ValueError(
                "Buffer size is too small for the layout. "
                f"Expected at least {needed} bytes, got {size} bytes."
            )
    view._ptr = int(buffer.handle) + layout.slice_offset_in_bytes
    view._device_id = buffer.device_id
    view._is_device_accessible = bool(buffer.is_device_accessible)
    view._readonly = bool(readonly)
    view._exporting_obj = view._buffer = buffer
    view._keep = (buffer,)
    view._layout_cache = layout
    view._dtype_cache = dtype


def _view_as_dlpack(view, obj, stream_ptr):
    kind, ordinal = obj.__dlpack_device__()
    if stream_ptr is not None:
        stream_ptr = _stream_int(stream_ptr, "stream_ptr")
    if kind == _CPU:
        device_id, accessible = -1, False
        if stream_ptr is None:
            raise BufferError("stream=None is ambiguous with view()")
        if stream_ptr == -1:
            stream_ptr = None
    elif kind == _CUDA:
        device_id, accessible = ordinal, True
        if stream_ptr is None:
            raise BufferError("stream=None is ambiguous with view()")
    elif kind in (_CUDA_HOST, _CUDA_MANAGED):
        device_id, accessible = ordinal, True
    else:
        raise BufferError("device not supported")
    stream = stream_ptr if stream_ptr else None
    try:
        capsule = obj.__dlpack__(stream=stream, max_version=_DLPACK_MAX_VERSION)
    except TypeError:
        capsule = obj.__dlpack__(stream=stream)
    _view_of_tensor(view, _custody._DLPackTensor(capsule), obj, device_id, accessible)


def _view_of_tensor(view, tensor, obj, device_id, accessible):
    """Fills ``view`` from a consumed DLPack tensor that ``obj`` exported."""
    kind, ordinal = tensor.device
    view._ptr = tensor.data
    view._device_id = device_id
    view._is_device_accessible = accessible
    view._readonly = tensor.readonly
    view._exporting_obj = obj
    view._keep = (tensor, obj)
    view._dl_device = (int(kind), int(ordinal) if kind == _CUDA else 0)
    view._layout_source = (tensor.shape, tensor.strides, _itemsize_of_dlpack(tensor.dtype))
    view._dtype_source = ("dlpack", tensor.dtype)


def _view_of_exchanged(capsule):
    """The view DLPack's C exchange table makes of a tensor a C consumer hands over (in
    ``capsule``, which becomes the view's ``exporting_obj``)."""
    tensor = _custody._DLPackTensor(capsule)
    kind, ordinal = tensor.device
    if kind == _CPU:
        device_id, accessible = -1, False
    elif kind in (_CUDA, _CUDA_HOST, _CUDA_MANAGED):
        device_id, accessible = ordinal, True
    else:
        raise BufferError("device not supported")
    view = StridedMemoryView._new()
    _view_of_tensor(view, tensor, capsule, device_id, accessible)
    return view


def _itemsize_of_dlpack(dtype):
    _code, bits, lanes = dtype
    total = bits * lanes
    if total % 8:
        raise ValueError("dl_tensor.dtype.bits must be a multiple of 8")
    return total // 8


def _view_as_cai(view, obj, stream_ptr):
    data = obj.__cuda_array_interface__
    _check_interface(data, "CUDA Array Interface")
    if stream_ptr is None:
        raise BufferError("stream=None is ambiguous with view()")
    stream_ptr = _stream_int(stream_ptr, "stream_ptr")
    ptr, readonly = _data_pair(data)
    layout = _layout_of_interface(data)
    producer = data.get("stream")
    if producer is not None:
        producer = operator.index(producer)
        if producer <= 0:
            raise BufferError(
                f"__cuda_array_interface__ names stream {producer}: a stream is a positive int "
                "(0 is disallowed)"
            )
    device_id = _custody._dlpack_device_of_pointer(ptr)[1] if ptr else _current_device_id()
    if stream_ptr != -1:
        if isinstance(obj, Buffer):
            # A custody buffer: one rule for every export that names a stream (the wait and
            # the declared use), as its __dlpack__ applies it.
            obj._export_to_stream(stream_ptr)
        elif producer is not None and producer != stream_ptr:
            event = Stream.from_handle(producer).record()
            Stream.from_handle(stream_ptr).wait(event)
    view._ptr = ptr
    view._readonly = readonly
    view._is_device_accessible = True
    view._device_id = device_id
    view._exporting_obj = obj
    view._keep = (obj,)
    view._layout_cache = layout
    view._dtype_source = ("typestr", data["typestr"])


# DLPack's C exchange table, on the type as DLPack asks (and under its earlier name).
StridedMemoryView.__dlpack_c_exchange_api__ = _custody._dlpack_exchange_api()
StridedMemoryView.__c_dlpack_exchange_api__ = StridedMemoryView.__dlpack_c_exchange_api__


class _StridedMemoryViewProxy:
    """What :func:`args_viewable_as_strided_memory` passes in an argument's place: the object
    (``obj``), whether it has DLPack (``has_dlpack``), and :meth:`view`."""

    __slots__ = ("obj", "has_dlpack")

    def __init__(self, obj):
        self.obj = obj
        self.has_dlpack = _check_has_dlpack(obj)

    def view(self, stream_ptr=None):
        """The argument's :class:`StridedMemoryView`, with ``stream_ptr`` the consumer stream."""
        if self.has_dlpack:
            return StridedMemoryView.from_dlpack(self.obj, stream_ptr)
        return StridedMemoryView.from_cuda_array_interface(self.obj, stream_ptr)


def args_viewable_as_strided_memory(
    arg_indices: Tuple[int, ...],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator that replaces the positional arguments at ``arg_indices`` (a tuple of ints)
    with proxies whose ``view(stream_ptr)`` gives their :class:`StridedMemoryView`, so that the
    function body reads any DLPack or CUDA Array Interface producer the same way::

        @args_viewable_as_strided_memory((0,))
        def scale(arr, stream):
            view = arr.view(stream.handle)
            ...

    ``RuntimeError`` at the call for an argument that supports neither protocol."""
    arg_indices = tuple(arg_indices)

    def decorate(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            args = list(args)
            for index in arg_indices:
                args[index] = _StridedMemoryViewProxy(args[index])
            return func(*args, **kwargs)

        return wrapped

    return decorate
