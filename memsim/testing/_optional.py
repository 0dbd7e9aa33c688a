"""The one place memsim.testing imports hypothesis, with an error that says how to get it."""

from __future__ import annotations

from types import ModuleType


def missing_hypothesis(what: str) -> ImportError:
    """The error for a missing hypothesis: ``what`` (the part of memsim.testing that needs it)
    and how to install it."""
    return ImportError(f"{what} needs hypothesis, an optional dependency of memsim: install it "
                       f"with pip install 'memsim[testing]'")


def import_hypothesis(what: str) -> ModuleType:
    """The hypothesis module, or :func:`missing_hypothesis`'s ImportError."""
    try:
        import hypothesis
    except ImportError as exc:
        raise missing_hypothesis(what) from exc
    return hypothesis
