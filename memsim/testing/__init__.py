"""Property-based testing of memsim's traffic counts, for users and for memsim itself."""
