"""The one JIT decorator of memsim's kernels: compiled lazily, cached on disk, no fast-math.

``cache=True`` keeps compiled kernels in Numba's cache so that a second process does not compile
again; ``nogil=True`` lets threads run kernels side by side; fast-math stays off so that counts and
times are reproducible bit for bit.
"""

from __future__ import annotations

import numba

jit = numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")

#: For small helpers on the per-tile path: inlined into their caller at Numba's IR level, so that
#: passing arrays to them costs no reference-count traffic.
jit_inline = numba.njit(cache=True, nogil=True, fastmath=False, error_model="numpy",
                        inline="always")
