"""Hypothesis profiles: 'ci' (derandomised, bounded; the default) and 'deep' for local runs.

Select one with HYPOTHESIS_PROFILE=deep python -m pytest. memsim.testing.use_profiles registers
both; tests that fix their own max_examples use memsim.testing.examples(n), which the deep
profile scales up twentyfold.
"""

from memsim.testing import use_profiles

use_profiles()
