"""What a decode run asks of a device: batch, context, formats, tiling, residency, seed."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from memsim.errors import ConfigError
from memsim.formats import get_format

RESIDENCY_POLICIES = ("auto", "lru", "pinned")


def _positive_int(value: Any, field: str, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", field=field)


@dataclass(frozen=True)
class Decode:
    """One decode workload.

    Attributes
    ----------
    batch : sequences decoded together.
    context : tokens already in each sequence's KV cache when the first emulated step starts.
    weights, kv, activations : storage formats (see ``memsim formats``).
    steps : consecutive decode steps emulated; the first is cold, the last is the warm steady state.
    new_tokens : tokens each sequence adds per step (1 for plain decode; gamma + 1 when a
        speculative verification step checks gamma drafted tokens).
    kv_block : paged-KV block size in tokens; a partially filled last block is read whole.
    tile_k, tile_n : weight tile (K x N elements); ``None`` takes the device's.
    residency : on-chip replacement policy: ``lru``; ``pinned`` keeps weights on chip once loaded
        (as many as fit, the rest go through LRU); ``auto`` pins for hybrid and SRAM-resident
        layouts and uses LRU otherwise.
    seed : seeds every pseudo-random choice (token ids of the embedding lookups).
    """

    batch: int = 1
    context: int = 4096
    weights: str = "bf16"
    kv: str = "bf16"
    activations: str = "bf16"
    steps: int = 2
    new_tokens: int = 1
    kv_block: int = 16
    tile_k: int | None = None
    tile_n: int | None = None
    residency: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        _positive_int(self.batch, "batch")
        _positive_int(self.context, "context", minimum=0)
        _positive_int(self.steps, "steps")
        _positive_int(self.new_tokens, "new_tokens")
        _positive_int(self.kv_block, "kv_block")
        _positive_int(self.seed, "seed", minimum=0)
        for name in ("tile_k", "tile_n"):
            if getattr(self, name) is not None:
                _positive_int(getattr(self, name), name)
        for name in ("weights", "kv", "activations"):
            get_format(getattr(self, name), field=name)
        if get_format(self.activations).group is not None:
            raise ConfigError(f"activations need a plain floating type such as bf16, got "
                              f"{self.activations!r}", field="activations")
        if self.residency not in RESIDENCY_POLICIES:
            raise ConfigError(f"expected one of {', '.join(RESIDENCY_POLICIES)}, got "
                              f"{self.residency!r}", field="residency")

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for reports and result stores."""
        return asdict(self)
