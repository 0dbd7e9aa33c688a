"""Property-based testing of memsim's traffic counts, for users and for memsim itself.

Checkers that any :class:`memsim.Report` must pass (plain functions, usable without
hypothesis), closed forms to compare against, and the hypothesis profiles. The strategies that
generate devices, models and workloads are in :mod:`memsim.testing.strategies`, which needs the
``memsim[testing]`` extra; ``import memsim`` imports neither. Guide: ``docs/testing.md``.
"""

from memsim.testing.closed_form import (StreamedBytes, assert_matches_closed_form, no_reuse,
                                        streamed_bytes)
from memsim.testing.invariants import (assert_conservation, assert_lower_bounds,
                                       assert_report_invariants, assert_same_traffic,
                                       assert_traffic_at_most)
from memsim.testing.monotone import assert_no_more_traffic_when, assert_not_slower_when
from memsim.testing.profiles import examples, use_profiles

__all__ = [
    "StreamedBytes", "assert_conservation", "assert_lower_bounds", "assert_matches_closed_form",
    "assert_no_more_traffic_when", "assert_not_slower_when", "assert_report_invariants",
    "assert_same_traffic", "assert_traffic_at_most", "examples", "no_reuse", "streamed_bytes",
    "use_profiles",
]
