"""The CPU time a call costs, and how it grows with its input: how the bounds tests show linearity.

Speed is never asserted. Linearity is shown by the CPU time of two sizes of one input (4x the
characters cost about 4x when linear, 16x when quadratic), the least of a few runs, with a wide
margin. The time is the calling thread's alone: the process's would count what the suite's other
threads (live servers, a worker pool) happen to run meanwhile. As timeit does, each call runs with
the garbage collector off: a full collection falls in one run and not another, and costs what every
live object of the process costs, not what the call does (a 50,000-character table measured 5x to
8x its quarter with it, 4x without).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

LINEAR = 8  # the most CPU time 4x the characters may cost: 4 when linear, 16 when quadratic
REPEATS = 3


def cpu_seconds(work: Callable[[str], object], text: str) -> float:
    """The CPU time ``work(text)`` takes on this thread, with the collector off."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        start = time.thread_time()
        work(text)
        return time.thread_time() - start
    finally:
        if collecting:
            gc.enable()


def growth(work: Callable[[str], object], make: Callable[[int], str], size: int) -> float:
    """How many times the CPU time of ``work`` on ``make(size // 4)`` its ``size`` input takes
    (the least of up to REPEATS runs of each, fewer when the first are clearly linear)."""
    small, large = make(size // 4), make(size)
    quarter = full = float("inf")
    for _ in range(REPEATS):
        quarter = min(quarter, cpu_seconds(work, small))
        full = min(full, cpu_seconds(work, large))
        if full < LINEAR * quarter:
            break
    return full / quarter
