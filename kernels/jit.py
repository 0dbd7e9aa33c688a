"""The one JIT decorator of memsim's kernels: compiled lazily, cached on disk, no fast-math.

``cache=True`` keeps compiled kernels in Numba's cache so that a second process does not compile
again; ``nogil=True`` lets threads run kernels side by side; fast-math stays off so that counts and
times are reproducible bit for bit.

A cache entry that cannot be read (a truncated or garbled ``.nbi`` index or ``.nbc`` data file,
left by a killed process or a full disk) is not an error: the kernel says so in one line on
stderr, empties its index and compiles again, and the fresh compilation is saved over it.
Numba's own cache raises ``UnpicklingError`` on every later call instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numba
from numba.core.caching import FunctionCache


class _CheckedCache(FunctionCache):
    """Numba's per-function disk cache, treating an unreadable entry as a miss."""

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:  # unpickling damaged bytes raises many types
            print(f"memsim: the Numba cache of {self._py_func.__qualname__} in "
                  f"{self._cache_path} is unreadable ({type(exc).__name__}: {exc}); "
                  f"recompiling it", file=sys.stderr)
            try:
                self.flush()        # an empty index: the recompiled kernel is saved afresh
            except OSError:
                pass                # a read-only cache: compile in memory every time
            return None


def _cached(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)`` whose disk cache survives a damaged entry."""
    def decorate(py_func: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(cache=True, **options)(py_func)
        dispatcher._cache = _CheckedCache(py_func)   # what Dispatcher.enable_caching installs
        return dispatcher
    return decorate


jit = _cached(nogil=True, fastmath=False, error_model="numpy")

#: For small helpers on the per-tile path: inlined into their caller at Numba's IR level, so that
#: passing arrays to them costs no reference-count traffic.
jit_inline = _cached(nogil=True, fastmath=False, error_model="numpy", inline="always")
