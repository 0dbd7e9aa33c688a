"""Capacity planning: the fewest chips that hold a model under each memory policy.

A configuration is tensor parallel ``tp`` x pipeline stages ``pp`` on one link domain
(``link.max_chips``). For each tensor-parallel degree that shards the model, the fewest stages
is what a greedy fill of the per-chip tensors gives (contiguous stages, each chip's tiers within
capacity); the plan that the emulator would run then confirms it. The answer is the smallest
``tp x pp``, ties going to fewer stages (a shorter pipeline).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memsim.device import Device
from memsim.errors import CapacityError, ConfigError
from memsim.layout import fewest_stage_cut, policies, shard, tp_degrees
from memsim.emulate import run_system
from memsim.model import Model
from memsim.plan import (SystemPlan, _item_specs, _Placer, parse_placement, plan_system,
                         tp_ranks_per_chip)
from memsim.workload import Decode


@dataclass(frozen=True)
class Configuration:
    """The smallest system that holds the workload under one policy, or why none does."""

    device: str
    policy: str
    tp: int
    pp: int
    fits: bool
    shortfall_bytes: int = 0      # when it does not fit: the smallest shortfall found
    reason: str = ""

    @property
    def chips(self) -> int:
        """Chips in the configuration."""
        return self.tp * self.pp

    def to_dict(self) -> dict:
        """Plain data."""
        return {**dataclasses.asdict(self), "chips": self.chips}


def _max_chips(device: Device) -> int:
    return device.link.max_chips if device.link is not None else 1


def _item_bytes(device: Device, model: Model, workload: Decode, policy: str,
                tp: int) -> list[tuple[int, ...]]:
    """Bytes per tier one chip of a ``tp`` group holds of each pipeline item (the embedding,
    each layer with its KV cache, the head)."""
    sized = dataclasses.replace(workload, tp=tp, pp=1, microbatches=1)
    tile_n = workload.tile_n or device.tile_n
    final_tokens = workload.context + workload.steps * workload.new_tokens
    placer = _Placer(device, model, sized, policy, parse_placement(workload.placement, device, model.layers),
                     tile_n)
    sh = shard(model, tp, tp_ranks_per_chip(device))
    items = _item_specs(model, sized, sh, tile_n, final_tokens, workload.batch)
    return [tuple(sum(placer.place(spec).bytes_on(i) for spec in item)
                  for i in range(len(device.tiers))) for item in items]


def _fewest_stages(device: Device, model: Model, workload: Decode, policy: str,
                   tp: int) -> int | None:
    """Fewest contiguous stages whose chips hold their tensors, or None when one item (the
    embedding, a layer, the head) alone overflows a chip at this ``tp``."""
    item_bytes = _item_bytes(device, model, workload, policy, tp)
    if policy == "tiered":          # the spill tier takes what the others cannot
        return 1
    cut = fewest_stage_cut(item_bytes, tuple(t.capacity for t in device.tiers))
    return None if cut is None else len(cut)


def fewest_chips(device: Device, model: Model, workload: Decode, policy: str) -> Configuration:
    """The smallest ``tp x pp`` that holds ``workload`` under ``policy`` on ``device``; among
    equally small ones, the one whose emulated warm step is fastest."""
    if policy not in policies(device):
        raise ConfigError(f"{device.name} does not support the {policy!r} policy; it supports "
                          f"{', '.join(policies(device))}", field="policy")
    limit = _max_chips(device)
    fitting: list[tuple[Configuration, SystemPlan]] = []
    shortfall = None
    for tp in tp_degrees(model, limit, tp_ranks_per_chip(device)):
        if fitting and tp > min(c.chips for c, _ in fitting):
            break
        stages = _fewest_stages(device, model, workload, policy, tp)
        if stages is None:
            continue
        # a tied LM head costs nothing extra when one stage also holds the embedding
        first_pp = 1 if model.tied_embeddings else stages
        for pp in range(first_pp, limit // tp + 1):
            if fitting and tp * pp > min(c.chips for c, _ in fitting):
                break
            trial = dataclasses.replace(workload, tp=tp, pp=pp, microbatches=None, policy=policy)
            try:
                system = plan_system(device, model, trial)
            except CapacityError as exc:
                shortfall = exc.shortfall_bytes if shortfall is None else min(
                    shortfall, exc.shortfall_bytes)
                continue
            fitting.append((Configuration(device.name, policy, tp, pp, True), system))
            break
    if fitting:
        fewest = min(c.chips for c, _ in fitting)
        ties = [(c, s) for c, s in fitting if c.chips == fewest]
        if len(ties) == 1:
            return ties[0][0]
        return min(ties, key=lambda pair: run_system(pair[1]).time_per_token)[0]
    aggregate = _aggregate_shortfall(device, model, workload, policy, limit)
    return Configuration(device.name, policy, 1, 1, False, max(aggregate, shortfall or 0),
                         f"does not fit in the {limit} chip(s) one link domain connects")


def _aggregate_shortfall(device: Device, model: Model, workload: Decode, policy: str,
                         chips: int) -> int:
    """Bytes by which the model's tensors (unsharded) exceed ``chips`` chips' tiers in total."""
    item_bytes = _item_bytes(device, model, workload, policy, 1)
    return max(0, max(sum(item[i] for item in item_bytes) - chips * tier.capacity
                      for i, tier in enumerate(device.tiers)))


def capacity_table(device: Device, model: Model, workload: Decode) -> list[Configuration]:
    """The fewest chips under each policy the device supports."""
    return [fewest_chips(device, model, workload, policy) for policy in policies(device)]


def smallest_system(device: Device, model: Model, workload: Decode,
                    table: list[Configuration] | None = None
                    ) -> tuple[Configuration, SystemPlan | None]:
    """The device's own policy at its fewest chips; another policy only when its own cannot
    hold the model. Returns the configuration and its plan (None when nothing fits)."""
    table = capacity_table(device, model, workload) if table is None else table
    chosen = next((c for c in table if c.fits), table[0])
    if not chosen.fits:
        return chosen, None
    trial = dataclasses.replace(workload, tp=chosen.tp, pp=chosen.pp, microbatches=None,
                                policy=chosen.policy)
    return chosen, plan_system(device, model, trial)
