"""Hypothesis profiles for memsim's property tests and for its users' own.

``ci`` is derandomised (the same examples on every run, so a red build is reproducible) and
bounded; ``deep`` is for long local runs and draws twenty times as many examples, fresh each
run. A test that fixes its own ``max_examples`` would not follow the profile, so it asks for
``examples(n)`` instead, which scales ``n`` by the profile.
"""

from __future__ import annotations

import os

from memsim.testing._optional import import_hypothesis

#: max_examples of the ``ci`` profile (hypothesis's own default); ``examples(n)`` scales by the
#: loaded profile's max_examples over this.
BASE_EXAMPLES = 100
DEEP_FACTOR = 20


def use_profiles(default: str = "ci") -> str:
    """Register the ``ci`` and ``deep`` profiles and load the one ``HYPOTHESIS_PROFILE`` names.

    Call it once from a ``conftest.py``. Returns the name of the loaded profile.
    """
    hypothesis = import_hypothesis("memsim.testing.use_profiles")
    settings, health = hypothesis.settings, hypothesis.HealthCheck
    settings.register_profile("ci", max_examples=BASE_EXAMPLES, derandomize=True, deadline=None,
                              print_blob=True, suppress_health_check=[health.too_slow])
    settings.register_profile("deep", max_examples=DEEP_FACTOR * BASE_EXAMPLES, deadline=None,
                              print_blob=True, suppress_health_check=[health.too_slow])
    name = os.environ.get("HYPOTHESIS_PROFILE", default)
    settings.load_profile(name)
    return name


def examples(n: int) -> int:
    """``n`` examples scaled by the loaded profile: ``n`` under ``ci``, ``20 n`` under ``deep``.

    Use it where a test fixes its own count, ``@settings(max_examples=examples(25))``, so that a
    deep run really draws more examples of it. It reads the profile when called, so call it at
    decoration time, after ``use_profiles()`` (a ``conftest.py`` runs first).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"expected a positive number of examples, got {n!r}")
    settings = import_hypothesis("memsim.testing.examples").settings
    return max(1, round(n * settings.default.max_examples / BASE_EXAMPLES))
