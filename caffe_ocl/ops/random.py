"""Seedable device random numbers (Philox2x32-10 in kernels/common.h).

Every draw takes a fresh (seed, stream) pair from one process-wide counter,
so a run is reproducible given ``set_random_seed`` (the solver's
``random_seed``), independent of how kernels are scheduled."""
import random as _pyrandom
import threading

from . import work_size

SRC = "pointwise.cl"

_lock = threading.Lock()
_state = {"seed": _pyrandom.SystemRandom().getrandbits(32), "stream": 0}


def set_random_seed(seed):
    with _lock:
        _state["seed"] = int(seed) & 0xFFFFFFFF
        _state["stream"] = 0


def next_stream():
    """(seed, stream) for one draw."""
    with _lock:
        _state["stream"] = (_state["stream"] + 1) & 0xFFFFFFFF
        return _state["seed"], _state["stream"]


def get_state():
    with _lock:
        return dict(_state)


def set_state(state):
    with _lock:
        _state.update(seed=int(state["seed"]), stream=int(state["stream"]))


def uniform(dev, buf, n, lo, hi):
    seed, stream = next_stream()
    g, l = work_size(dev, n)
    dev.launch(SRC, "rng_uniform", g, l, [n, buf, lo, hi, seed, stream]).run(dev.queue)


def gaussian(dev, buf, n, mean, std):
    seed, stream = next_stream()
    g, l = work_size(dev, n)
    dev.launch(SRC, "rng_gaussian", g, l, [n, buf, mean, std, seed, stream]).run(dev.queue)


def sparsify(dev, buf, n, keep_prob):
    seed, stream = next_stream()
    g, l = work_size(dev, n)
    dev.launch(SRC, "rng_sparsify", g, l, [n, buf, keep_prob, seed, stream]).run(dev.queue)
