"""The strided layout behind :class:`custody.utils.StridedMemoryView`: a shape, strides in
elements, an item size in bytes and the offset of the first element, with the arithmetic a view
needs (its bounds, the bytes it spans, slicing).

This is cuda.core 1.2's private ``_StridedLayout`` (``cuda.core._layout``) as far as a
``StridedMemoryView`` uses it: construction, ``dense``, ``dense_like``, the properties and
slicing. Its reshaping methods (``reshaped``, ``permuted``, ``flattened``, ``squeezed``,
``unsqueezed``, ``broadcast_to``, ``repacked``) are not provided.
"""

from __future__ import annotations

import math
import operator


def _dense_strides(shape, order):
    """Element strides of a dense tensor of ``shape`` whose axes, from the slowest to the
    fastest varying, are ``order`` (a permutation of ``range(len(shape))``)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


def _axis_order(stride_order, ndim):
    if stride_order == "C":
        return tuple(range(ndim))
    if stride_order == "F":
        return tuple(reversed(range(ndim)))
    order = tuple(stride_order)
    if sorted(order) != list(range(ndim)):
        raise ValueError(
            f"stride_order must be 'C', 'F' or a permutation of {tuple(range(ndim))}, got "
            f"{stride_order!r}"
        )
    return order


def _ints(name, values):
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(f"{name} must be a tuple of ints, got {values!r}") from None


class _StridedLayout:
    """The layout of a strided tensor: ``shape`` (non-negative extents), ``strides`` (in
    elements, or None for an implicitly C-contiguous tensor), ``itemsize`` (bytes per element)
    and ``slice_offset`` (the offset, in elements, of the element at index ``(0,) * ndim``, which
    only slicing makes non-zero).

    ``_StridedLayout(shape, strides, itemsize, divide_strides=False)``: with
    ``divide_strides=True`` the strides are given in bytes and divided by ``itemsize``
    (``ValueError`` when one is not a multiple). ``ValueError`` for a negative extent, strides of
    another length than the shape, or an item size below 1; ``TypeError`` for non-int values.
    """

    __slots__ = ("_shape", "_strides", "itemsize", "slice_offset")

    def __init__(self, shape, strides, itemsize, divide_strides=False):
        shape = _ints("shape", shape)
        if any(extent < 0 for extent in shape):
            raise ValueError(f"shape must be non-negative, got {shape}")
        itemsize = operator.index(itemsize)
        if itemsize < 1:
            raise ValueError(f"itemsize must be at least 1, got {itemsize}")
        if strides is not None:
            strides = _ints("strides", strides)
            if len(strides) != len(shape):
                raise ValueError(
                    f"strides {strides} must have as many entries as shape {shape}"
                )
            if divide_strides:
                if any(s % itemsize for s in strides):
                    raise ValueError(
                        f"strides must be divisible by itemsize: strides {strides} (bytes), "
                        f"itemsize {itemsize}"
                    )
                strides = tuple(s // itemsize for s in strides)
        self._shape = shape
        self._strides = strides
        self.itemsize = itemsize
        self.slice_offset = 0

    @classmethod
    def dense(cls, shape, itemsize, stride_order="C"):
        """A dense layout of ``shape``: strides in C order (``"C"``, the last axis varies
        fastest), F order (``"F"``) or the order a permutation of the axes gives (its last axis
        has stride 1)."""
        shape = _ints("shape", shape)
        return cls(shape, _dense_strides(shape, _axis_order(stride_order, len(shape))), itemsize)

    @classmethod
    def dense_like(cls, other, stride_order="K"):
        """A dense layout with ``other``'s shape and item size and no slice offset: its strides in
        ``other``'s order (``"K"``), or in C order, F order or a permutation's."""
        if stride_order == "K":
            stride_order = other.stride_order
        return cls.dense(other.shape, other.itemsize, stride_order)

    def _with(self, shape, strides, offset):
        layout = _StridedLayout(shape, strides, self.itemsize)
        layout.slice_offset = offset
        return layout

    @property
    def ndim(self):
        """The number of dimensions."""
        return len(self._shape)

    @property
    def shape(self):
        """The extents, a tuple of ints."""
        return self._shape

    @property
    def strides(self):
        """The strides in elements, or None when the layout is implicitly C-contiguous."""
        return self._strides

    @property
    def _effective_strides(self):
        if self._strides is not None:
            return self._strides
        return _dense_strides(self._shape, tuple(range(len(self._shape))))

    @property
    def strides_in_bytes(self):
        """The strides in bytes, or None when the layout is implicitly C-contiguous."""
        if self._strides is None:
            return None
        return tuple(s * self.itemsize for s in self._strides)

    @property
    def stride_order(self):
        """The axes from the one with the largest stride to the one with the smallest (a
        permutation of ``range(ndim)``; ties keep the axes' order)."""
        strides = self._effective_strides
        return tuple(sorted(range(self.ndim), key=lambda axis: -abs(strides[axis])))

    @property
    def volume(self):
        """The number of elements (the product of the extents)."""
        return math.prod(self._shape)

    def _contiguous_in(self, order):
        if self.volume == 0:
            return True
        strides = self._effective_strides
        step = 1
        for axis in reversed(order):
            if self._shape[axis] != 1:
                if strides[axis] != step:
                    return False
                step *= self._shape[axis]
        return True

    @property
    def is_contiguous_c(self):
        """Whether the elements are contiguous in C order (extents of 1 ignored)."""
        return self._contiguous_in(tuple(range(self.ndim)))

    @property
    def is_contiguous_f(self):
        """Whether the elements are contiguous in F order (extents of 1 ignored)."""
        return self._contiguous_in(tuple(reversed(range(self.ndim))))

    @property
    def is_contiguous_any(self):
        """Whether the elements are contiguous in some order of the axes."""
        return self._contiguous_in(self.stride_order)

    @property
    def is_dense(self):
        """Contiguous in some order and not offset: the elements map one to one onto the offsets
        ``0 .. volume - 1``."""
        return self.is_contiguous_any and self.slice_offset == 0

    @property
    def offset_bounds(self):
        """``(min_offset, max_offset)``, in elements, of the elements; ``(0, -1)`` when there are
        none."""
        if self.volume == 0:
            return 0, -1
        low = high = self.slice_offset
        for extent, stride in zip(self._shape, self._effective_strides):
            span = (extent - 1) * stride
            if span < 0:
                low += span
            else:
                high += span
        return low, high

    @property
    def min_offset(self):
        """The smallest element offset (see :attr:`offset_bounds`)."""
        return self.offset_bounds[0]

    @property
    def max_offset(self):
        """The largest element offset (see :attr:`offset_bounds`)."""
        return self.offset_bounds[1]

    @property
    def slice_offset_in_bytes(self):
        """:attr:`slice_offset` in bytes."""
        return self.slice_offset * self.itemsize

    def required_size_in_bytes(self):
        """The bytes an allocation needs for every element to lie inside it: ``(max_offset + 1) *
        itemsize``. ``ValueError`` when an element lies before the start (``min_offset < 0``, a
        negative stride or offset)."""
        low, high = self.offset_bounds
        if low < 0:
            raise ValueError(
                f"the layout {self!r} reaches {low} elements before its start, so no allocation "
                "size covers it: please use _StridedLayout.to_dense()."
            )
        return (high + 1) * self.itemsize

    def to_dense(self, stride_order="K"):
        """:meth:`dense_like` of this layout."""
        return _StridedLayout.dense_like(self, stride_order)

    def sliced(self, slices):
        """The layout of ``tensor[slices]``: ``slices`` is an int, a slice or a tuple of them, one
        per leading axis (an int drops its axis). ``IndexError`` for too many indices or an int
        out of range; ``TypeError`` for anything else."""
        if not isinstance(slices, tuple):
            slices = (slices,)
        if len(slices) > self.ndim:
            raise IndexError(f"{len(slices)} indices for a layout of {self.ndim} dimensions")
        strides = self._effective_strides
        shape, new_strides, offset = [], [], self.slice_offset
        for axis, index in enumerate(slices):
            extent, stride = self._shape[axis], strides[axis]
            if isinstance(index, slice):
                start, stop, step = index.indices(extent)
                count = len(range(start, stop, step))
                if count:
                    offset += start * stride
                shape.append(count)
                new_strides.append(stride * step)
                continue
            try:
                position = operator.index(index)
            except TypeError:
                raise TypeError(f"a layout is sliced with ints and slices, got {index!r}") from None
            if not -extent <= position < extent:
                raise IndexError(f"index {position} is out of range for extent {extent}")
            offset += (position % extent) * stride
        shape += self._shape[len(slices):]
        new_strides += strides[len(slices):]
        return self._with(tuple(shape), tuple(new_strides), offset)

    def __getitem__(self, slices):
        return self.sliced(slices)

    def __eq__(self, other):
        if not isinstance(other, _StridedLayout):
            return NotImplemented
        return (
            self._shape == other._shape
            and self.itemsize == other.itemsize
            and self.slice_offset == other.slice_offset
            and self._effective_strides == other._effective_strides
        )

    def __hash__(self):
        return hash((self._shape, self._effective_strides, self.itemsize, self.slice_offset))

    def __repr__(self):
        return (
            f"_StridedLayout(shape={self._shape}, strides={self._strides}, "
            f"itemsize={self.itemsize}, slice_offset={self.slice_offset})"
        )
