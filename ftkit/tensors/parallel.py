"""A process-wide thread pool for numpy kernels, and striping of element ranges over it.

numpy ufuncs, reductions, BLAS dots and xxh3 release the GIL, so threads give real
parallelism for array work. ``stripes(n)`` cuts ``range(n)`` into contiguous ranges of at
least ``STRIPE`` elements (one task each), and ``map_ordered(fn, args)`` runs ``fn`` over them
on the pool and returns the results in order, so per-stripe partial results can be merged
deterministically (the result never depends on the thread count or on timing).

Small inputs run inline on the calling thread. Kernels given to the pool must not submit to
it themselves (no nesting). ``workers()`` is the number of CPUs this process may use,
overridable with ``FTKIT_THREADS``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import ThreadPoolExecutor

T = TypeVar("T")
R = TypeVar("R")

STRIPE = 1 << 20  # elements per task: large enough to amortise dispatch, small enough to balance
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def workers() -> int:
    """Threads to use: ``FTKIT_THREADS`` if set (>= 1), else the CPUs this process may run on."""
    env = os.environ.get("FTKIT_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def pool() -> ThreadPoolExecutor:
    """The shared pool (created on first use, ``workers()`` threads, daemon-like at exit)."""
    global _pool
    from concurrent.futures import ThreadPoolExecutor  # imported when first needed (start-up)

    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="ftkit-np")
        return _pool


def stripes(n: int, stripe: int | None = None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(n)`` in order, each at most ``stripe`` long
    (default: ``STRIPE``, read when called)."""
    step = max(1, STRIPE if stripe is None else stripe)
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def map_ordered(fn: Callable[[T], R], args: Sequence[T] | Iterable[T]) -> list[R]:
    """``[fn(x) for x in args]`` computed on the pool when there is more than one item and more
    than one worker; results in input order; the first exception is re-raised."""
    items = list(args)
    if len(items) <= 1 or workers() == 1:
        return [fn(x) for x in items]
    return list(pool().map(fn, items))
