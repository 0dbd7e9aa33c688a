"""Hypothesis strategies for memsim's inputs: tiers, devices, models, formats, workloads, what-ifs.

As in ``hypothesis.extra.numpy`` and ``xarray.testing.strategies``, every parameter is
keyword-only and takes a plain value or a strategy; the defaults are strategies (or ``None``:
drawn to suit the other parameters). What they generate is valid by construction (every device
loads, every model and workload is accepted) and small, so that an emulation takes
milliseconds; :func:`invalid_devices` generates device data the loader must reject.

Needs the ``memsim[testing]`` extra (hypothesis); ``import memsim`` never imports this module.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from memsim.testing._optional import missing_hypothesis

try:
    from hypothesis import strategies as st
    from hypothesis.errors import InvalidArgument
    from hypothesis.strategies import SearchStrategy
except ImportError as exc:
    raise missing_hypothesis("memsim.testing.strategies") from exc

from memsim.device import Device, device as catalog_device, parse_device
from memsim.formats import FORMATS
from memsim.layout import policies
from memsim.model import Model
from memsim.testing._devices import (OFF_CHIP_KINDS, perturbable_fields, perturbed_overrides,
                                     scratch_data, text, tier_tables)
from memsim.testing._invalid import InvalidDevice, invalid_device_data
from memsim.testing._studies import InvalidStudy, invalid_studies
from memsim.workload import RESIDENCY_POLICIES, Decode

__all__ = ["InvalidDevice", "InvalidStudy", "decodes", "device_data", "devices", "formats",
           "invalid_devices", "invalid_studies", "models", "overrides", "perturbable_fields",
           "tiers"]

# Each parameter takes a plain value or a strategy of them.
Ints: TypeAlias = "int | SearchStrategy[int]"
Strs: TypeAlias = "str | SearchStrategy[str]"
Bools: TypeAlias = "bool | SearchStrategy[bool]"
Floats: TypeAlias = "float | SearchStrategy[float]"
#: a figure in base units (B, B/s, s, J/bit) or a string with its unit; None: drawn
Figure: TypeAlias = "float | str | SearchStrategy[float] | SearchStrategy[str] | None"
#: a Device, a catalog name or a device file's path
DeviceLike: TypeAlias = "Device | str | Path | SearchStrategy[Device] | SearchStrategy[str]"


def _st(value: Any) -> SearchStrategy[Any]:
    """A parameter as a strategy: strategies pass through, plain values become ``just``."""
    return value if isinstance(value, SearchStrategy) else st.just(value)


def _maybe(value: Any) -> SearchStrategy[Any] | None:
    """``None`` (drawn to suit the other parameters) stays None; anything else as a strategy."""
    return None if value is None else _st(value)


def _device(value: Device | str | Path) -> Device:
    """A Device, a catalog name or a device file's path, as a Device."""
    return value if isinstance(value, Device) else catalog_device(str(value))


# Tiers and devices ----------------------------------------------------------------------------

def tiers(*, kind: Strs = st.sampled_from(OFF_CHIP_KINDS), name: Strs | None = None,
          capacity: Figure = None, bandwidth: Figure = None, sustained_bandwidth: Figure = None,
          latency: Figure = None, energy: Figure = None,
          granularity: Figure = None) -> SearchStrategy[dict[str, str]]:
    """Tier tables as a device file's ``[[tiers]]`` entry (``Device.with_tier`` takes one).

    Figures are numbers in base units (B, B/s, s, J/bit) or strings with a unit (``"80 GB"``);
    ``None`` draws one typical of the kind (on chip, ``kind="sram"``: 64 KiB-1 GiB at
    1-200 TB/s; further out: 1 GiB-2 TiB at 1 GB/s-10 TB/s). ``name`` defaults to the kind;
    ``sustained_bandwidth`` is 50-100% of the peak or left out; ``granularity`` is a power of two
    that fits. A tier added further out must not be both faster and smaller than the one inside.
    """
    figures = {"capacity": _maybe(capacity), "bandwidth": _maybe(bandwidth),
               "sustained_bandwidth": _maybe(sustained_bandwidth), "latency": _maybe(latency),
               "energy": _maybe(energy), "granularity": _maybe(granularity)}
    return tier_tables(_st(kind), _maybe(name), figures)


def device_data(*, base: DeviceLike | None = None, perturb: Floats = 2.0,
                policy: Strs | None = None, on_chip_capacity: Figure = None,
                cores: Ints | None = None,
                off_chip_tiers: Ints | None = None) -> SearchStrategy[dict[str, Any]]:
    """A device file's data (as :func:`memsim.device.parse_device` takes it), valid.

    With ``base`` (a catalog name, a device file's path or a Device), the base device with each
    figure of :func:`perturbable_fields` scaled by a factor in [1/perturb, perturb] (shrinking
    to the base itself; ``perturb=1`` changes only what the other parameters set). Without, a
    device drawn from scratch around ``policy`` (one of memsim's policies, drawn by default),
    with ``off_chip_tiers`` tiers beyond the on-chip one (at least what the policy needs), small
    chips to wafers. ``on_chip_capacity`` (bytes, or a string with a unit) and ``cores`` set
    those figures; capacities further out grow to keep the device valid.
    """
    if base is None:
        return scratch_data(
            policy=_maybe(policy),
            on_chip_capacity=_maybe(on_chip_capacity), off_chip_tiers=_maybe(off_chip_tiers),
            cores=_st(cores) if cores is not None else st.integers(1, 1024))
    if off_chip_tiers is not None:
        raise InvalidArgument("off_chip_tiers is for devices drawn from scratch; add a tier to "
                              "a base device with Device.with_tier")
    return _perturbed_data(_st(base), _st(perturb), _maybe(policy), _maybe(on_chip_capacity),
                           _maybe(cores))


@st.composite
def _perturbed_data(draw, base, perturb, policy, on_chip_capacity, cores) -> dict[str, Any]:
    dev = _device(draw(base))
    fixed: dict[str, Any] = {}
    if on_chip_capacity is not None:
        fixed[f"tiers.{dev.tiers[0].name}.capacity"] = text(draw(on_chip_capacity), "B")
    if cores is not None:
        fixed["cores"] = draw(cores)
    if policy is not None:
        fixed["layout.policy"] = draw(policy)
        if fixed["layout.policy"] not in policies(dev):
            raise InvalidArgument(f"{dev.name} supports the policies {', '.join(policies(dev))}"
                                  f", not {fixed['layout.policy']!r}")
    entries = draw(perturbed_overrides(dev, perturbable_fields(dev), draw(perturb), fixed))
    return dev.with_overrides(entries).data if entries else copy.deepcopy(dev.data)


def devices(*, base: DeviceLike | None = None, perturb: Floats = 2.0,
            policy: Strs | None = None, on_chip_capacity: Figure = None,
            cores: Ints | None = None,
            off_chip_tiers: Ints | None = None) -> SearchStrategy[Device]:
    """Devices, valid by construction: :func:`device_data`, loaded.

    ``devices(base="h100-sxm", on_chip_capacity=st.integers(2**20, 2**28))`` is an H100 with its
    figures perturbed and an L2 of 1-256 MiB; ``devices()`` draws any kind of chip.
    """
    data = device_data(base=base, perturb=perturb, policy=policy,
                       on_chip_capacity=on_chip_capacity, cores=cores,
                       off_chip_tiers=off_chip_tiers)
    return data.map(lambda d: parse_device(d, file=f"{d['name']} (memsim.testing)"))


def overrides(*, device: DeviceLike, fields: Sequence[str] | None = None,
              scale: Floats = 2.0) -> SearchStrategy[dict[str, Any]]:
    """What-ifs for ``Device.with_overrides``: each of ``fields`` (dotted paths; default
    :func:`perturbable_fields`) scaled by a factor in [1/scale, scale] or left as it is, every
    combination valid for ``device`` (a Device, catalog name or path, or a strategy of them).
    Shrinks to no override."""
    return _overrides(_st(device), fields, _st(scale))


@st.composite
def _overrides(draw, device, fields, scale) -> dict[str, Any]:
    dev = _device(draw(device))
    chosen = perturbable_fields(dev) if fields is None else tuple(fields)
    return draw(perturbed_overrides(dev, chosen, draw(scale), {}))


def invalid_devices(*, base: DeviceLike | None = None,
                    perturb: Floats = 2.0) -> SearchStrategy[InvalidDevice]:
    """Device data with one mistake, and the field the loader must name for it.

    Each example is an :class:`InvalidDevice` ``(data, field, mistake)``:
    ``parse_device(example.data, file=...)`` must raise a :class:`memsim.ConfigError` whose
    ``field`` is ``example.field``. The valid data it starts from is :func:`device_data` with
    ``base`` and ``perturb``.
    """
    return invalid_device_data(device_data(base=base, perturb=perturb))


# Models, formats, workloads ---------------------------------------------------------------

def models(*, layers: Ints = st.integers(1, 4), hidden: Ints = st.integers(1, 512),
           kv_heads: Ints = st.integers(1, 4), q_per_kv: Ints = st.integers(1, 4),
           head_dim: Ints = st.integers(1, 128), ffn: Ints = st.integers(1, 1024),
           vocab: Ints = st.integers(1, 4096), tied_embeddings: Bools = st.booleans(),
           experts: Ints = st.just(1) | st.integers(2, 8), experts_per_token: Ints | None = None,
           shared_experts: Ints | None = None, dense_layers: Ints | None = None,
           dense_ffn: Ints | None = None, name: Strs = "generated") -> SearchStrategy[Model]:
    """Transformer shapes, dense and mixture-of-experts, as :class:`memsim.Model`.

    ``heads`` is ``kv_heads * q_per_kv`` (grouped-query attention). ``experts=1`` is a dense
    model (the default draws dense and MoE alike and shrinks to dense); for an MoE model
    ``experts_per_token`` (default 1 to min(experts, 4)), ``shared_experts`` (0-2),
    ``dense_layers`` (0 to layers - 1) and ``dense_ffn`` (drawn like ``ffn``) apply. Any
    positive size is allowed, ragged against every tile: that is where counting goes wrong.
    """
    return _models(_st(layers), _st(hidden), _st(kv_heads), _st(q_per_kv), _st(head_dim),
                   _st(ffn), _st(vocab), _st(tied_embeddings), _st(experts),
                   _maybe(experts_per_token), _maybe(shared_experts), _maybe(dense_layers),
                   _maybe(dense_ffn), _st(name))


@st.composite
def _models(draw, layers, hidden, kv_heads, q_per_kv, head_dim, ffn, vocab, tied, experts,
            per_token, shared, dense_layers, dense_ffn, name) -> Model:
    n_layers, n_kv = draw(layers), draw(kv_heads)
    shape = dict(name=draw(name), display_name="generated model", layers=n_layers,
                 hidden=draw(hidden), heads=n_kv * draw(q_per_kv), kv_heads=n_kv,
                 head_dim=draw(head_dim), ffn=draw(ffn), vocab=draw(vocab),
                 tied_embeddings=draw(tied))
    n_experts = draw(experts)
    if n_experts > 1:
        def pick(given, default):
            return draw(given if given is not None else default)
        moe = dict(experts=n_experts,
                   experts_per_token=pick(per_token, st.integers(1, min(n_experts, 4))),
                   shared_experts=pick(shared, st.integers(0, 2)),
                   dense_layers=pick(dense_layers, st.integers(0, n_layers - 1)))
        moe["dense_ffn"] = pick(dense_ffn, ffn) if moe["dense_layers"] else 0
        if moe["experts_per_token"] > n_experts:
            raise InvalidArgument(f"experts_per_token {moe['experts_per_token']} exceeds "
                                  f"experts {n_experts}")
        if moe["dense_layers"] >= n_layers:
            raise InvalidArgument(f"dense_layers {moe['dense_layers']} leaves none of "
                                  f"{n_layers} layers to the experts")
        shape.update(moe)
    for key in ("layers", "hidden", "kv_heads", "heads", "head_dim", "ffn", "vocab"):
        if shape[key] < 1:
            raise InvalidArgument(f"{key} must be positive, got {shape[key]}")
    return Model(**shape)


_ROLES = ("weights", "kv", "activations")


def formats(*, role: str = "weights") -> SearchStrategy[str]:
    """Names of storage formats for a ``role``: ``"weights"`` or ``"kv"`` (every catalog format,
    and ``int4-gN`` for any group N from 8 to 512), or ``"activations"`` (plain floating types).
    Shrinks towards bf16."""
    if role not in _ROLES:
        raise InvalidArgument(f"role must be one of {', '.join(_ROLES)}, got {role!r}")
    plain = ["bf16"] + [n for n, f in FORMATS.items() if f.group is None and n != "bf16"]
    if role == "activations":
        return st.sampled_from(plain)
    grouped = [n for n, f in FORMATS.items() if f.group is not None]
    return st.sampled_from(plain + grouped) | st.integers(8, 512).map(lambda n: f"int4-g{n}")


def decodes(*, batch: Ints = st.integers(1, 8), context: Ints = st.integers(0, 512),
            weights: Strs = formats(role="weights"), kv: Strs = formats(role="kv"),
            activations: Strs = formats(role="activations"), steps: Ints = st.integers(1, 3),
            new_tokens: Ints = 1, kv_block: Ints = st.sampled_from([16, 1, 8, 32, 64]),
            tile_k: Ints | None = st.none() | st.integers(8, 256),
            tile_n: Ints | None = st.none() | st.integers(8, 256),
            residency: Strs = st.sampled_from(RESIDENCY_POLICIES),
            seed: Ints = st.integers(0, 2**16),
            routing: Strs = "uniform", tp: Ints = 1,
            pp: Ints = 1, ep: Ints = 1, microbatches: Ints | None = None, policy: Strs = "auto",
            placement: Mapping[str, str] | SearchStrategy[Mapping[str, str]] = st.just({}),
            draft_heads: Ints = 0) -> SearchStrategy[Decode]:
    """Decode workloads, :class:`memsim.Decode`, one field per parameter.

    One chip by default: ``tp``, ``pp`` and ``ep`` must suit the model and device drawn with
    them (``tp`` dividing the heads and FFN width, ``ep`` the experts and the batch) and
    ``microbatches`` must divide the batch; a workload that does not is refused with a
    ConfigError. ``tile_k``/``tile_n`` of None take the device's tile. ``routing`` is uniform
    unless given: a skewed routing on a dense model is refused, so pass one (e.g.
    ``st.sampled_from(["uniform", "zipf:1.2"])``) only with MoE models.
    """
    fields = dict(batch=batch, context=context, weights=weights, kv=kv, activations=activations,
                  steps=steps, new_tokens=new_tokens, kv_block=kv_block, tile_k=tile_k,
                  tile_n=tile_n, residency=residency, seed=seed, routing=routing, tp=tp, pp=pp,
                  ep=ep, microbatches=microbatches, policy=policy, placement=placement,
                  draft_heads=draft_heads)
    return st.builds(Decode, **{key: _st(value) for key, value in fields.items()})
