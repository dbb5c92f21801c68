"""Faster R-CNN region proposals (kernels/proposal.cl): decode + clip + size
filter, descending rank (pre-NMS top-N), NMS suppression bits and the greedy
selection into roi rows."""
from . import work_size

SRC = "proposal.cl"


def _launch(dev, n, name, args):
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, args)


def words(cap):
    """ulongs per row of the NMS suppression mask."""
    return (cap + 63) // 64


def proposals(dev, n, anchors_n, hw, stride, min_size, pre_cap, post_n, nms_thresh,
              cls, deltas, info, anchors, scratch, rois, scores, count):
    """Launches computing ``rois`` (post_n x 5 capacity), ``scores`` and
    ``count`` (kept rows) from the RPN outputs. ``scratch``: dict of
    buffers from ``scratch_sizes``."""
    h, w = hw
    wd = words(pre_cap)
    s = scratch
    return [
        _launch(dev, n, "proposal_decode",
                [n, anchors_n, h, w, float(stride), float(min_size), cls, deltas, info,
                 anchors, s["boxes"], s["keys"], s["valid"]]),
        _launch(dev, n, "proposal_rank",
                [n, pre_cap, s["keys"], s["valid"], s["boxes"], s["sorted"], s["sorted_keys"]]),
        _launch(dev, pre_cap * wd, "proposal_nms_mask",
                [pre_cap, wd, float(nms_thresh), s["sorted"], s["mask"]]),
        dev.launch(SRC, "proposal_nms_select", (1,), (1,),
                   [n, pre_cap, wd, int(post_n), s["valid"], s["sorted"], s["sorted_keys"],
                    s["mask"], s["removed"], rois, scores, count]),
    ]


def scratch_sizes(n, pre_cap):
    """Bytes of each scratch buffer ``proposals`` needs."""
    wd = words(pre_cap)
    return {"boxes": 16 * n, "keys": 4 * n, "valid": 4 * n, "sorted": 16 * pre_cap,
            "sorted_keys": 4 * pre_cap, "mask": 8 * pre_cap * wd, "removed": 8 * wd}
