"""memsim's Numba kernels: tile walkers and the on-chip residency model.

Importing this package compiles nothing; each kernel compiles on its first call (or loads from
Numba's on-disk cache). Kernels take and return plain numpy arrays and scalars only.
"""
