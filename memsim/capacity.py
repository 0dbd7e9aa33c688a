"""Capacity planning: the fewest chips that hold a model under each memory policy.

A configuration is tensor parallel ``tp`` x pipeline stages ``pp`` on one link domain
(``link.max_chips``), without expert parallelism whatever the workload asks (a workload's
``ep`` is planned as given by ``memsim.plan``; the table says what a dense split needs). For
each tensor-parallel degree that shards the model, the fewest stages is what a greedy fill of
the per-chip tensors gives (contiguous stages, each chip's tiers within capacity); the plan
that the emulator would run then confirms it. The answer is the smallest
``tp x pp``, ties going to fewer stages (a shorter pipeline).

:func:`max_batch` answers the other way round: the largest batch a given configuration holds
(``max_batch_table``: per chip count), with the time per token at that batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memsim.device import Device
from memsim.errors import CapacityError, ConfigError
from memsim.layout import fewest_stage_cut, policies, tp_degrees
from memsim.emulate import run_system
from memsim.model import Model
from memsim.plan import SystemPlan, item_tier_bytes, plan_system, tp_ranks_per_chip
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
    return item_tier_bytes(device, model, dataclasses.replace(workload, tp=tp, pp=1, ep=1,
                                                              microbatches=1), policy)


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
        for pp in range(first_pp, min(limit // tp, model.layers + 2) + 1):   # longer folds into tp
            if fitting and tp * pp > min(c.chips for c, _ in fitting):
                break
            trial = dataclasses.replace(workload, tp=tp, pp=pp, ep=1, microbatches=None,
                                        policy=policy)
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


# The largest batch ------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchCapacity:
    """The largest batch one configuration holds, and how fast it decodes there.

    ``batch`` is 0 when not even one sequence fits (``reason`` says why); ``time_per_token_s``
    and ``tokens_per_s_total`` are then 0.
    """

    device: str
    policy: str
    tp: int
    pp: int
    context: int
    batch: int
    ep: int = 1
    time_per_token_s: float = 0.0
    tokens_per_s_total: float = 0.0
    reason: str = ""

    @property
    def chips(self) -> int:
        """Chips in the configuration."""
        return self.tp * self.pp * self.ep

    def to_dict(self) -> dict:
        """Plain data."""
        return {**dataclasses.asdict(self), "chips": self.chips}


MAX_BATCH_LIMIT = 1 << 20        # sequences: the search stops here even if more would fit


def max_batch(device: Device, model: Model, workload: Decode) -> BatchCapacity:
    """The largest batch whose weights and KV caches (at ``workload.context`` plus the emulated
    steps) fit ``workload.tp x pp x ep`` chips under the workload's policy (``auto``: the
    device's own, without the fallback to ``tiered``), and the warm step's time per token at
    that batch. ``workload.batch`` is ignored; under expert parallel the batch stays a
    multiple of ``ep``.

    Capacity is the plan's own check (placement rules, paging, padding and pipeline cuts
    included); the KV cache grows linearly with the batch, so a bisection over the batch
    finds the edge.
    """
    policy = device.layout.policy if workload.policy == "auto" else workload.policy
    step = workload.ep

    def plan_at(batch: int) -> SystemPlan | None:
        trial = dataclasses.replace(workload, batch=batch, microbatches=None, policy=policy)
        try:
            return plan_system(device, model, trial)
        except CapacityError:
            return None

    row = dict(device=device.name, policy=policy, tp=workload.tp, pp=workload.pp,
               context=workload.context, ep=workload.ep)
    if plan_at(step) is None:
        return BatchCapacity(**row, batch=0, reason="one sequence does not fit")
    fits, short = 1, 2                          # in units of ``step`` sequences
    while short * step <= MAX_BATCH_LIMIT and plan_at(short * step) is not None:
        fits, short = short, 2 * short
    while short - fits > 1:
        mid = (fits + short) // 2
        fits, short = (mid, short) if plan_at(mid * step) is not None else (fits, mid)
    batch = fits * step
    report = run_system(plan_at(batch))
    return BatchCapacity(**row, batch=batch, time_per_token_s=report.time_per_token,
                         tokens_per_s_total=report.tokens_per_s_total)


def max_batch_table(device: Device, model: Model, workload: Decode) -> list[BatchCapacity]:
    """:func:`max_batch` per chip count: every tensor-parallel degree that shards the model
    without padding, each on the fewest pipeline stages that hold one sequence, within the link
    domain (``workload``'s ``batch``, ``tp``, ``pp`` and ``ep`` are ignored)."""
    policy = device.layout.policy if workload.policy == "auto" else workload.policy
    limit = _max_chips(device)
    rows = []
    for tp in tp_degrees(model, limit, tp_ranks_per_chip(device)):
        one = dataclasses.replace(workload, batch=1, tp=tp, pp=1, ep=1, microbatches=None)
        stages = _fewest_stages(device, model, one, policy, tp)
        if stages is None:
            rows.append(BatchCapacity(device.name, policy, tp, 1, workload.context, 0,
                                      reason="one item (the embedding, a layer or the head) "
                                             "alone overflows a chip"))
        elif tp * stages <= limit:
            rows.append(max_batch(device, model, dataclasses.replace(one, pp=stages)))
    return rows
