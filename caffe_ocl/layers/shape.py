"""Shape and data-movement layers with BVLC Caffe's semantics: Concat,
Slice, Flatten, Reshape, Crop, Tile, Silence, Filter, BatchReindex
(Eltwise: layers/eltwise.py; Reduction, ArgMax: layers/reduction.py;
Parameter, Embed: layers/embed.py).

Host reads: Filter's top shape depends on the selector's values, and
BatchReindex checks its indices (as Caffe's check_batch_reindex) and builds
the index lists of its atomic-free backward from them; these two layers read
their index bottom on the host in every forward (a sync point, as in Caffe,
whose Filter and BatchReindex read ``cpu_data()`` too). No other layer here
reads the device.
"""
import numpy as np

from ..errors import DataError, ShapeError
from ..ops import pointwise
from ..ops import shape as shape_ops
from .base import Layer, register


def _no_inplace(layer, bottom, top):
    if bottom[0] is top[0]:
        raise layer.error("does not allow in-place computation")


def _int_buffer(dev, values):
    """A device int32 buffer holding ``values`` (reshape-time only)."""
    arr = np.ascontiguousarray(values, dtype=np.int32)
    buf = dev.alloc(max(arr.nbytes, 4))
    if arr.size:
        dev.upload(buf, arr)
    return buf, arr


# ----------------------------------------------------------------------------
# Concat / Slice
# ----------------------------------------------------------------------------

@register("Concat")
class ConcatLayer(Layer):
    min_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.concat_param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise self.error("either axis or concat_dim should be specified; not both")

    def reshape(self, bottom, top):
        p = self.param.concat_param
        b0 = bottom[0]
        if p.HasField("concat_dim"):
            ax = p.concat_dim
            if ax >= b0.num_axes:
                raise self.error(f"concat_dim {ax} out of range for {b0.num_axes}-D bottom "
                                 f"{b0.name!r}", ShapeError)
        else:
            ax = self.canonical_axis(b0, p.axis)
        shape = list(b0.shape)
        for b in bottom[1:]:
            if b.num_axes != b0.num_axes:
                raise self.error(f"all inputs must have the same number of axes: "
                                 f"{b0.name!r} {b0.shape} vs {b.name!r} {b.shape}", ShapeError)
            for j in range(b0.num_axes):
                if j != ax and b.shape[j] != b0.shape[j]:
                    raise self.error(f"all inputs must have the same shape except at the "
                                     f"concat axis {ax}: {b0.name!r} {b0.shape} vs "
                                     f"{b.name!r} {b.shape}", ShapeError)
            shape[ax] += b.shape[ax]
        top[0].reshape(shape)
        self.fwd = []
        self.layout = None
        if len(bottom) == 1:
            top[0].share_data(b0)
            top[0].share_diff(b0)
            return
        outer, inner = b0.count_range(0, ax), b0.count_range(ax + 1)
        cols, off = [], 0
        for b in bottom:
            cols.append((b.shape[ax] * inner, off * inner))
            off += b.shape[ax]
        # (rows, top row length, [(columns, first top column)] per bottom):
        # what plan/concat.py copies a subset of the bottoms with
        self.layout = (outer, shape[ax] * inner, cols)
        self.fwd = self.copies([(b.data_buffer(), c, 0, d) for b, (c, d) in zip(bottom, cols)],
                               top[0].data_buffer())

    def copies(self, pieces, y):
        """Launches writing ``pieces`` [(buffer, cols, off, dcol)] into the
        top's buffer ``y`` (several bottoms per launch, ops.shape.multi_copy)."""
        outer, ld_top, _ = self.layout
        return shape_ops.multi_copy(self.device, outer, y, 0, ld_top, pieces, gather=True)

    def build_backward(self, bottom, top):
        if self.layout is None:
            return
        outer, ld_top, cols = self.layout
        pieces = [(b.diff_buffer(), c, 0, d) for i, (b, (c, d)) in enumerate(zip(bottom, cols))
                  if self.propagate_down[i]]
        self.bwd = shape_ops.multi_copy(self.device, outer, top[0].diff_buffer(), 0, ld_top,
                                        pieces, gather=False)


@register("Slice")
class SliceLayer(Layer):
    exact_num_bottom = 1
    min_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.slice_param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise self.error("either axis or slice_dim should be specified; not both")
        self.points = list(p.slice_point)

    def reshape(self, bottom, top):
        p = self.param.slice_param
        b = bottom[0]
        if p.HasField("slice_dim"):
            ax = p.slice_dim
            if ax >= b.num_axes:
                raise self.error(f"slice_dim {ax} out of range for {b.num_axes}-D bottom "
                                 f"{b.name!r}", ShapeError)
        else:
            ax = self.canonical_axis(b, p.axis)
        L = b.shape[ax]
        if self.points:
            if len(self.points) != len(top) - 1:
                raise self.error(f"{len(self.points)} slice_point(s) for {len(top)} tops; "
                                 f"need {len(top) - 1}")
            if len(top) > L:
                raise self.error(f"{len(top)} tops but the slice axis {ax} has only {L} "
                                 f"elements", ShapeError)
            sizes, prev = [], 0
            for sp in self.points:
                if sp <= prev:
                    raise self.error(f"slice_point must be strictly increasing and > 0, got "
                                     f"{self.points}")
                sizes.append(sp - prev)
                prev = sp
            if prev > L:
                raise self.error(f"slice_point {prev} out of range for axis {ax} of size {L} "
                                 f"(bottom shape {b.shape})", ShapeError)
            sizes.append(L - prev)
        else:
            if L % len(top):
                raise self.error(f"number of tops ({len(top)}) should evenly divide the "
                                 f"slice axis {ax} of size {L}", ShapeError)
            sizes = [L // len(top)] * len(top)
        outer, inner = b.count_range(0, ax), b.count_range(ax + 1)
        self.axis, self.sizes = ax, sizes       # (plan/slice_concat.py reads them)
        self.fwd, self.layout = [], None
        cols, off = [], 0
        for t, s in zip(top, sizes):
            shape = list(b.shape)
            shape[ax] = s
            t.reshape(shape)
            cols.append((s * inner, off * inner))
            off += s
        if len(top) == 1:
            top[0].share_data(b)
            top[0].share_diff(b)
            return
        self.layout = (outer, L * inner, cols)
        self.fwd = shape_ops.multi_copy(
            self.device, outer, b.data_buffer(), 0, L * inner,
            [(t.data_buffer(), c, 0, d) for t, (c, d) in zip(top, cols)], gather=False)

    def build_backward(self, bottom, top):
        if not self.propagate_down[0] or self.layout is None:
            return
        outer, ld, cols = self.layout
        self.bwd = shape_ops.multi_copy(
            self.device, outer, bottom[0].diff_buffer(), 0, ld,
            [(t.diff_buffer(), c, 0, d) for t, (c, d) in zip(top, cols)], gather=True)


# ----------------------------------------------------------------------------
# Flatten / Reshape (views: share data and diff)
# ----------------------------------------------------------------------------

class _ViewLayer(Layer):
    """A top that is another shape of the bottom: shares its data and diff,
    so forward and backward do nothing (Flatten, Reshape)."""
    exact_num_bottom = 1
    exact_num_top = 1

    def view_as(self, bottom, top, shape):
        top[0].reshape(shape)
        top[0].share_data(bottom[0])
        top[0].share_diff(bottom[0])
        self.fwd = []

    def build_backward(self, bottom, top):
        pass   # the diff is shared


@register("Flatten")
class FlattenLayer(_ViewLayer):

    def reshape(self, bottom, top):
        _no_inplace(self, bottom, top)
        p, b = self.param.flatten_param, bottom[0]
        start = self.canonical_axis(b, p.axis)
        end = self.canonical_axis(b, p.end_axis, "end_axis")
        if end < start:
            raise self.error(f"end_axis {p.end_axis} comes before axis {p.axis} for bottom "
                             f"shape {b.shape}", ShapeError)
        self.view_as(bottom, top,
                     b.shape[:start] + (b.count_range(start, end + 1),) + b.shape[end + 1:])


@register("Reshape")
class ReshapeLayer(_ViewLayer):

    def layer_setup(self, bottom, top):
        _no_inplace(self, bottom, top)
        dims = list(self.param.reshape_param.shape.dim)
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        if len(inferred) > 1:
            raise self.error(f"new shape {dims} contains multiple -1 dims; at most one "
                             "may be specified")
        if any(d < -1 for d in dims):
            raise self.error(f"new shape {dims} has a dimension below -1")
        self.inferred_axis = inferred[0] if inferred else -1
        self.constant_count = int(np.prod([d for d in dims if d > 0], dtype=np.int64))
        self.dims = dims

    def reshape(self, bottom, top):
        p, b = self.param.reshape_param, bottom[0]
        nax = b.num_axes
        start = p.axis if p.axis >= 0 else nax + p.axis + 1
        if not 0 <= start <= nax:
            raise self.error(f"axis {p.axis} out of range for {nax}-D bottom {b.shape}",
                             ShapeError)
        if p.num_axes < -1:
            raise self.error(f"num_axes must be >= 0, or -1 for all; got {p.num_axes}")
        end = nax if p.num_axes == -1 else start + p.num_axes
        if end > nax:
            raise self.error(f"axis + num_axes = {end} is out of range for {nax}-D bottom "
                             f"{b.shape}", ShapeError)
        shape = list(b.shape[:start]) + list(self.dims) + list(b.shape[end:])
        for i in self.copy_axes:
            if start + i >= nax:
                raise self.error(f"new shape {self.dims} contains a 0 at index {i}, but there "
                                 f"is no corresponding bottom axis to copy ({b.shape})",
                                 ShapeError)
            shape[start + i] = b.shape[start + i]
        if self.inferred_axis >= 0:
            explicit = self.constant_count * b.count_range(0, start) * b.count_range(end)
            for i in self.copy_axes:
                explicit *= shape[start + i]
            if explicit == 0 or b.count % explicit:
                raise self.error(f"bottom count ({b.count}, shape {b.shape}) must be divisible "
                                 f"by the product of the specified dimensions ({explicit})",
                                 ShapeError)
            shape[start + self.inferred_axis] = b.count // explicit
        count = int(np.prod(shape, dtype=np.int64))
        if count != b.count:
            raise self.error(f"output count {count} (shape {tuple(shape)}) must match input "
                             f"count {b.count} (shape {b.shape})", ShapeError)
        self.view_as(bottom, top, shape)


# ----------------------------------------------------------------------------
# Crop / Tile
# ----------------------------------------------------------------------------

@register("Crop")
class CropLayer(Layer):
    """Crop bottom[0] to bottom[1]'s shape from ``axis`` on, at ``offset``.
    No gradient flows to bottom[1] (it only supplies the size)."""
    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def layer_setup(self, bottom, top):
        p = self.param.crop_param
        if bottom[0].num_axes != bottom[1].num_axes:
            raise self.error(f"the data and reference blobs must have the same number of "
                             f"axes: {bottom[0].shape} vs {bottom[1].shape}", ShapeError)
        start = self.canonical_axis(bottom[0], p.axis)
        if len(p.offset) > 1 and start + len(p.offset) != bottom[0].num_axes:
            raise self.error(f"{len(p.offset)} offsets given; the number of offsets must "
                             f"equal the number of dimensions from axis {start} on "
                             f"({bottom[0].num_axes - start})")

    def reshape(self, bottom, top):
        p, b, ref = self.param.crop_param, bottom[0], bottom[1]
        if b.num_axes != ref.num_axes:
            raise self.error(f"the data and reference blobs must have the same number of "
                             f"axes: {b.shape} vs {ref.shape}", ShapeError)
        nd = b.num_axes
        start = self.canonical_axis(b, p.axis)
        offsets, shape = [0] * nd, list(b.shape)
        for i in range(start, nd):
            off = 0
            if len(p.offset) == 1:
                off = p.offset[0]
            elif len(p.offset) > 1:
                off = p.offset[i - start]
            if b.shape[i] - off < ref.shape[i]:
                raise self.error(f"the crop for dimension {i} is out of bounds: size "
                                 f"{ref.shape[i]} at offset {off} does not fit in "
                                 f"{b.shape[i]} (bottom {b.shape}, reference {ref.shape})",
                                 ShapeError)
            shape[i], offsets[i] = ref.shape[i], off
        top[0].reshape(shape)
        strides = [b.count_range(d + 1) for d in range(nd)]
        self._geom, self._geom_host = _int_buffer(self.device, shape + strides + offsets)
        self.nd = nd
        self.fwd = [shape_ops.crop_copy(self.device, top[0].count, nd, self._geom,
                                        b.data_buffer(), top[0].data_buffer(), True,
                                        row=shape[-1])]

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            b = bottom[0]
            self.bwd = [pointwise.fill_launch(self.device, b.diff_buffer(), b.count, 0.0),
                        shape_ops.crop_copy(self.device, top[0].count, self.nd, self._geom,
                                            top[0].diff_buffer(), b.diff_buffer(), False,
                                            row=top[0].shape[-1])]


@register("Tile")
class TileLayer(Layer):
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        p, b = self.param.tile_param, bottom[0]
        ax = self.canonical_axis(b, p.axis)
        if not p.HasField("tiles"):
            raise self.error("number of tiles (tile_param.tiles) must be specified")
        if p.tiles <= 0:
            raise self.error(f"number of tiles must be positive, got {p.tiles}")
        self.tiles = p.tiles
        shape = list(b.shape)
        shape[ax] *= p.tiles
        top[0].reshape(shape)
        self.outer, self.inner = b.count_range(0, ax), b.count_range(ax)
        self.fwd = [shape_ops.tile(self.device, self.outer, self.tiles, self.inner,
                                   b.data_buffer(), top[0].data_buffer())]

    def build_backward(self, bottom, top):
        if self.propagate_down[0]:
            self.bwd = [shape_ops.tile_backward(self.device, self.outer, self.tiles, self.inner,
                                                top[0].diff_buffer(), bottom[0].diff_buffer())]


# ----------------------------------------------------------------------------
# Silence / Filter / BatchReindex
# ----------------------------------------------------------------------------

@register("Silence")
class SilenceLayer(Layer):
    """Consumes bottoms, no top; backward writes zero diffs."""
    min_bottom = 1
    exact_num_top = 0

    def reshape(self, bottom, top):
        self.fwd = []

    def build_backward(self, bottom, top):
        self.bwd = [pointwise.fill_launch(self.device, b.diff_buffer(), b.count, 0.0)
                    for b, pd in zip(bottom, self.propagate_down) if pd]


@register("Filter")
class FilterLayer(Layer):
    """Forward the items (along axis 0) of bottoms 0..k-1 whose selector
    (last bottom) value is non-zero. The top shape depends on the selector's
    *values*: each forward reads the selector on the host (the only host read
    of this layer), uploads the kept indices and reshapes the tops (at most
    the bottoms' size, so no reallocation). Before the first forward the tops
    have the bottoms' size, as in Caffe."""
    min_bottom = 2
    min_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index < self._nbottom - 1

    def layer_setup(self, bottom, top):
        self._nbottom = len(bottom)
        if len(top) != len(bottom) - 1:
            raise self.error(f"needs one top per filtered bottom: {len(bottom) - 1} tops "
                             f"for {len(bottom)} bottoms, got {len(top)}")
        self.nsel = None

    def reshape(self, bottom, top):
        sel = bottom[-1]
        if sel.num_axes < 1 or any(d != 1 for d in sel.shape[1:]):
            raise self.error(f"selector blob dimensions must be singletons (1) except the "
                             f"first, got {sel.shape}", ShapeError)
        n = sel.shape[0]
        for b in bottom[:-1]:
            if b.num_axes < 1 or b.shape[0] != n:
                raise self.error(f"each bottom must have the same 0th dimension as the "
                                 f"selector ({n}): {b.name!r} {b.shape}", ShapeError)
        self.n = n
        self.idx = self.device.alloc(4 * max(n, 1))
        self.dims = [b.count_range(1) for b in bottom[:-1]]
        for t, b in zip(top, bottom[:-1]):
            t.reshape(b.shape)      # full size first (Caffe's first_reshape_)
        self.fwd = [shape_ops.gather_rows(self.device, n, d, self.idx, b.data_buffer(),
                                          t.data_buffer())
                    for t, b, d in zip(top, bottom[:-1], self.dims)]
        self.nsel = None

    def forward_impl(self, bottom, top):
        sel = bottom[-1].host_data().reshape(-1)[:self.n]      # documented host read
        keep = np.flatnonzero(sel != 0).astype(np.int32)
        self.nsel = int(keep.size)
        if keep.size:
            self.device.upload(self.idx, keep)
        for t, b in zip(top, bottom[:-1]):
            t.reshape((self.nsel,) + b.shape[1:])
        for launch in self.fwd:
            launch.set_arg(0, self.nsel)
        super().forward_impl(bottom, top)

    def build_backward(self, bottom, top):
        if self.propagate_down[-1]:
            raise self.error("cannot backpropagate to the selector (last) bottom")
        self._scatter = []
        for i, (t, b, d) in enumerate(zip(top, bottom[:-1], self.dims)):
            if self.propagate_down[i]:
                s = shape_ops.scatter_rows(self.device, self.n, d, self.idx, t.diff_buffer(),
                                           b.diff_buffer())
                self._scatter.append(s)
                self.bwd += [pointwise.fill_launch(self.device, b.diff_buffer(), b.count, 0.0), s]

    def backward_impl(self, top, propagate_down, bottom):
        if self.nsel is None:
            raise self.error("backward before forward")
        for s in self._scatter:
            s.set_arg(0, self.nsel)
        super().backward_impl(top, propagate_down, bottom)


@register("BatchReindex")
class BatchReindexLayer(Layer):
    """top[i] = bottom[0][perm[i]] along axis 0 (perm = bottom[1], 1-D).
    Each forward reads perm on the host to check it (as Caffe's
    check_batch_reindex) and to build the per-item index lists that make
    backward a deterministic gather-sum (no atomics)."""
    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        b, perm = bottom
        if perm.num_axes != 1:
            raise self.error(f"the index bottom must be 1-D, got shape {perm.shape}",
                             ShapeError)
        if b.num_axes < 1:
            raise self.error(f"data bottom must have at least 1 axis, got {b.shape}",
                             ShapeError)
        self.m, self.n = perm.shape[0], b.shape[0]
        self.dim = b.count_range(1)
        top[0].reshape((self.m,) + b.shape[1:])
        dev = self.device
        self.idx = dev.alloc(4 * max(self.m, 1))
        self.begin = dev.alloc(4 * max(self.n, 1))
        self.cnt = dev.alloc(4 * max(self.n, 1))
        self.order = dev.alloc(4 * max(self.m, 1))
        self.fwd = [shape_ops.gather_rows(dev, self.m, self.dim, self.idx, b.data_buffer(),
                                          top[0].data_buffer())]
        self._ready = False

    def forward_impl(self, bottom, top):
        perm = bottom[1].host_data().reshape(-1)              # documented host read
        bad = np.flatnonzero(~((perm >= 0) & (perm < self.n)))
        if bad.size:
            raise self.error(f"index {perm[bad[0]]!r} at position {bad[0]} is outside "
                             f"[0, {self.n}) (the batch size of {bottom[0].name!r})",
                             DataError)
        idx = perm.astype(np.int32)
        counts = np.bincount(idx, minlength=self.n).astype(np.int32)
        begin = (np.cumsum(counts) - counts).astype(np.int32)
        order = np.argsort(idx, kind="stable").astype(np.int32)
        dev = self.device
        if idx.size:
            dev.upload(self.idx, idx)
            dev.upload(self.order, order)
        if counts.size:
            dev.upload(self.cnt, counts)
            dev.upload(self.begin, begin)
        self._ready = True
        super().forward_impl(bottom, top)

    def build_backward(self, bottom, top):
        if self.propagate_down[1]:
            raise self.error("cannot backpropagate to the index bottom")
        if self.propagate_down[0]:
            self.bwd = [shape_ops.gather_sum_rows(self.device, self.n, self.dim, self.begin,
                                                  self.cnt, self.order, top[0].diff_buffer(),
                                                  bottom[0].diff_buffer())]

    def backward_impl(self, top, propagate_down, bottom):
        if not self._ready:
            raise self.error("backward before forward")
        super().backward_impl(top, propagate_down, bottom)
