"""Sequence primitives of the OCR forks (kernels/fork_sequence.cl)."""
from . import work_size

SRC = "fork_sequence.cl"


def ctc_greedy_decode(dev, T, N, C, blank, merge_repeated, probs, out):
    """out [N, T] = the greedy CTC decoding of probs [T, N, C], -1 padded."""
    g, l = work_size(dev, N)
    return dev.launch(SRC, "ctc_greedy_decode", g, l,
                      [T, N, C, blank, int(bool(merge_repeated)), probs, out])
