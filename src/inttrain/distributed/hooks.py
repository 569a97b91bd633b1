"""Int8 gradient communication for ``torch.nn.parallel.DistributedDataParallel``.

>>> state = Int8HookState(process_group=None, seed=0)
>>> ddp_model.register_comm_hook(state, int8_allreduce_hook)

Per bucket the hook

1. adds the error-feedback residual kept from the previous step (``x = grad + residual``),
2. cuts ``x`` into chunks of ``state.chunk_size`` elements and agrees on one scale per chunk
   across ranks (all-reduce MAX of the chunk absmax, ``scale = amax / 127``); after
   ``state.bind(model)`` every parameter gets its own chunks, in model order, so the result does
   not depend on how DDP groups parameters into buckets,
3. rounds ``x / scale`` stochastically to int8 codes in [-127, 127] with a ``torch.Generator``
   seeded from ``(seed, rank, step, parameter index)`` (``bucket index`` without ``bind``) --
   randomness is explicit and reproducible,
4. sums the codes exactly in int32 across ranks (``mode="allgather"``: all-gather of the int8
   codes then a local int32 sum -- the default, 1 byte per element on the wire; or
   ``mode="allreduce"``: all-reduce of the codes widened to int32, 4 bytes per element), with no
   overflow possible (``|sum| <= 127 * world_size``),
5. dequantizes and divides by the world size (the average, like the default hook), and
6. keeps ``residual = x - codes * scale`` (what this rank failed to send) for the next step.

Non-finite gradients: if any rank has an inf/nan in a chunk, the agreed amax is non-finite on
every rank, the chunk's result is NaN on every rank (as with fp32 all-reduce) and the residual
is left untouched, so :func:`all_ranks_finite` lets all ranks skip the same step.
"""


from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Int8HookState", "int8_allreduce_hook", "fp32_allreduce_hook", "all_ranks_finite", "FP32HookState"]

_QMAX = 127
_MIN_AMAX = torch.finfo(torch.float32).tiny * 2 * _QMAX
_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 63) - 1


def _seed_for(seed: int, rank: int, step: int, index: int) -> int:
    h = seed & _MASK
    for v in (rank, step, index):
        h = ((h ^ (v + 0x632BE5AB)) * _MIX + 0xBF58476D1CE4E5B9) & _MASK
        h ^= h >> 29
    return h


@dataclass
class Int8HookState:
    """State of :func:`int8_allreduce_hook` (one per DDP model).

    Attributes:
        process_group: the group DDP uses (``None``: the default group).
        chunk_size: elements that share one scale.
        seed: base seed of the stochastic rounding.
        mode: ``"allgather"`` (int8 codes on the wire, default) or ``"allreduce"`` (int32).
        error_feedback: keep the quantization residual and add it next step.
        step: number of completed steps (incremented after the last bucket of a step).
        bytes_per_step: payload bytes this rank put into collectives, one entry per step
            (codes + per-chunk scales for the amax agreement).
        fp32_bytes_per_step: what the default fp32 all-reduce would have put in, per step.
        max_scale_per_step: largest finite chunk scale (``amax / 127``) used in each step; the
            per-element error of the averaged gradient is below ``2 * scale`` with error feedback
            (this step's rounding plus last step's residual), below ``scale`` without.
        skipped_steps: steps where some chunk's agreed scale was non-finite.
        residuals: the error-feedback residual per parameter (keyed by parameter name after
            :meth:`bind`, else by a per-process id), so it survives DDP's bucket rebuild and can be
            checkpointed (:meth:`state_dict` / :meth:`load_state_dict`, one per rank).
    """

    process_group: dist.ProcessGroup | None = None
    chunk_size: int = 2048
    seed: int = 0
    mode: str = "allgather"
    error_feedback: bool = True
    step: int = 0
    bytes_per_step: list[int] = field(default_factory=list)
    fp32_bytes_per_step: list[int] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    max_scale_per_step: list[float] = field(default_factory=list)
    residuals: dict = field(default_factory=dict, repr=False)
    param_names: dict[int, str] = field(default_factory=dict, repr=False)
    _param_order: dict[str, int] = field(default_factory=dict, repr=False)
    _segment_cache: dict = field(default_factory=dict, repr=False)
    _bytes: int = 0
    _fp32_bytes: int = 0
    _nonfinite: bool = False
    _max_scale: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in ("allgather", "allreduce"):
            raise ValueError(f"mode must be 'allgather' or 'allreduce', got {self.mode!r}")
        if self.chunk_size <= 0:
            raise ValueError("chunk_size must be positive")

    def bind(self, model: torch.nn.Module) -> "Int8HookState":
        """Name the residuals by ``model``'s parameter names (needed for :meth:`state_dict`)."""
        named = list(model.named_parameters())
        self.param_names = {id(p): name for name, p in named}
        self._param_order = {name: i for i, (name, _) in enumerate(named)}
        self._segment_cache = {}
        return self

    def state_dict(self) -> dict:
        """This rank's hook state: step counter and residuals by parameter name (plain containers).

        Residuals differ per rank: save one per rank and give each rank its own back.
        """
        named = {k: v.detach().clone() for k, v in self.residuals.items() if isinstance(k, str)}
        if len(named) != len(self.residuals):
            raise ValueError("Int8HookState.state_dict needs parameter names: call state.bind(model) first")
        return {"step": self.step, "skipped_steps": list(self.skipped_steps), "seed": self.seed,
                "chunk_size": self.chunk_size, "mode": self.mode, "residuals": named}

    def load_state_dict(self, d: dict) -> None:
        """Restore :meth:`state_dict` (step counter and residuals; the next step continues exactly)."""
        self.step = int(d["step"])
        self.skipped_steps = list(d.get("skipped_steps", []))
        self.residuals = {k: v.detach().clone().float() for k, v in d.get("residuals", {}).items()}

    @property
    def last_bytes(self) -> int:
        return self.bytes_per_step[-1] if self.bytes_per_step else 0

    def _end_bucket(self, is_last: bool) -> None:
        if not is_last:
            return
        self.bytes_per_step.append(self._bytes)
        self.fp32_bytes_per_step.append(self._fp32_bytes)
        self.max_scale_per_step.append(self._max_scale)
        self._max_scale = 0.0
        if self._nonfinite:
            self.skipped_steps.append(self.step)
        self._bytes = self._fp32_bytes = 0
        self._nonfinite = False
        self.step += 1


def _segments(state: Int8HookState, bucket: dist.GradBucket, n: int, cs: int):
    """The bucket as chunk-aligned segments, independent of DDP's bucket layout where possible.

    Returns (segments, pos, padded): ``segments`` = [(residual key, seed index, start, size)] in the
    order they are quantized (a segment starts at a chunk boundary, so no chunk spans two segments),
    ``pos[i]`` = where element ``i`` of the flat bucket goes in the padded vector of length ``padded``.
    With parameter names (:meth:`Int8HookState.bind`), every parameter is its own segment, in the
    model's parameter order and seeded by its index: the same gradients give the same codes however
    DDP groups and orders them (its first-iteration buckets, the rebuilt ones, a resumed run's).
    Otherwise the bucket is one segment (seeded by the bucket index).
    """
    params = bucket.parameters()
    cache_key = (bucket.index(), n, cs, tuple(id(p) for p in params))
    hit = state._segment_cache.get(cache_key)
    if hit is None:
        hit = state._segment_cache[cache_key] = _build_segments(state, bucket, params, n, cs)
    return hit


def _build_segments(state: Int8HookState, bucket: dist.GradBucket, params: list, n: int, cs: int):
    sizes = [p.numel() for p in params]
    order = state._param_order
    if not state.param_names or sum(sizes) != n or any(state.param_names.get(id(p)) not in order for p in params):
        padded = (n + cs - 1) // cs * cs
        return [(("bucket", bucket.index(), n), bucket.index(), 0, n)], None, padded
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)
    entries = sorted(((order[state.param_names[id(p)]], state.param_names[id(p)], off, size)
                      for p, off, size in zip(params, offsets, sizes)))
    segments, pieces, start = [], [], 0
    for index, name, off, size in entries:
        segments.append((name, (1 << 32) + index, start, size))
        pieces.append((off, start, size))
        start += (size + cs - 1) // cs * cs
    pos = torch.empty(n, dtype=torch.long)
    for off, st, size in pieces:
        pos[off:off + size] = torch.arange(st, st + size)
    return segments, pos, start


def _padded_input(state: Int8HookState, buf: torch.Tensor, segments: list, pos: torch.Tensor | None,
                  n: int, padded: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The bucket in chunk layout (zero padded) plus each parameter's error-feedback residual; (x, residual)."""
    x = torch.zeros(padded, dtype=torch.float32, device=buf.device)
    if pos is None:
        x[:n] = buf.reshape(-1)
    else:
        x[pos] = buf.reshape(-1).float()
    residual = None
    if state.error_feedback and any(key in state.residuals for key, _, _, _ in segments):
        # Residuals are kept per parameter (per bucket without names), so they survive DDP's bucket
        # rebuild after the first iteration and a resume (whose first buckets are the initial ones).
        residual = torch.zeros(padded, dtype=torch.float32, device=buf.device)
        for key, _, st, size in segments:
            r = state.residuals.get(key)
            if r is not None and r.numel() == size:
                residual[st:st + size] = r.reshape(-1).to(buf.device)
        x += residual
    return x, residual


def _agreed_scales(state: Int8HookState, xc: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor]:
    """One scale per chunk, the same on every rank: all-reduce MAX of the chunk absmax; (amax, finite, scale)."""
    amax = xc.abs().amax(dim=1)
    amax = torch.nan_to_num(amax, nan=float("inf"), posinf=float("inf"))  # nan -> inf so it survives MAX
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    finite = torch.isfinite(amax)
    # amax / 127 must be a normal float: a chunk of denormal gradients would get scale 0 (0/0 = NaN codes);
    # such chunks quantize with scale 1/127, i.e. to (almost always) zero codes, and keep their value as residual.
    safe_amax = torch.where(finite & (amax > _MIN_AMAX), amax, torch.ones_like(amax))
    scale = (safe_amax / _QMAX).unsqueeze(1)
    state._max_scale = max(state._max_scale, float(torch.where(finite, amax, 0).max()) / _QMAX)
    return amax, finite, scale


def _stochastic_codes(state: Int8HookState, xc: torch.Tensor, finite: torch.Tensor, scale: torch.Tensor,
                      segments: list, rank: int) -> torch.Tensor:
    """Stochastic rounding to int8 codes with explicit randomness, seeded per (seed, rank, step, parameter)."""
    nchunks, cs = xc.shape
    padded = nchunks * cs
    gen = torch.Generator(device=xc.device)
    noise = torch.empty(padded, dtype=torch.float32, device=xc.device)
    for i, (_, seed_index, st, size) in enumerate(segments):
        end = segments[i + 1][2] if i + 1 < len(segments) else padded
        gen.manual_seed(_seed_for(state.seed, rank, state.step, seed_index))
        noise[st:end] = torch.rand(end - st, generator=gen, device=xc.device, dtype=torch.float32)
    noise = noise.view(nchunks, cs)
    xs = torch.where(finite.unsqueeze(1), xc / scale, torch.zeros_like(xc))
    return torch.floor(xs + noise).clamp_(-_QMAX, _QMAX)


def _keep_residuals(state: Int8HookState, xc: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
                    finite: torch.Tensor, residual: torch.Tensor | None, segments: list) -> None:
    """Error feedback: what the codes did not carry is added to the next step's gradient (per parameter)."""
    new_res = xc - codes * scale
    if residual is not None and not bool(finite.all()):
        new_res = torch.where(finite.unsqueeze(1), new_res, residual.view(xc.shape))
    elif not bool(finite.all()):
        new_res = torch.where(finite.unsqueeze(1), new_res, torch.zeros_like(new_res))
    flat_res = new_res.reshape(-1)
    for key, _, st, size in segments:
        state.residuals[key] = flat_res[st:st + size].clone()


def _exact_sum(state: Int8HookState, codes8: torch.Tensor, world: int, group: Any) -> torch.futures.Future:
    """The int32 sum of every rank's int8 codes: all-gather + local sum, or an int32 all-reduce."""
    if state.mode == "allgather":
        gathered = [torch.empty_like(codes8) for _ in range(world)]
        work = dist.all_gather(gathered, codes8, group=group, async_op=True)
        state._bytes += codes8.numel() * codes8.element_size()

        def _sum(_fut: torch.futures.Future) -> torch.Tensor:
            total = gathered[0].to(torch.int32)  # widen once, then add the other ranks' int8 codes in place
            for g in gathered[1:]:
                total.add_(g)
            return total

        return work.get_future().then(_sum)
    wide = codes8.to(torch.int32)
    work = dist.all_reduce(wide, group=group, async_op=True)
    state._bytes += wide.numel() * wide.element_size()
    return work.get_future().then(lambda _fut: wide)


def int8_allreduce_hook(state: Int8HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket across ranks with int8 codes (see module doc)."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    buf = bucket.buffer()
    n = buf.numel()
    cs = state.chunk_size
    segments, pos, padded = _segments(state, bucket, n, cs)
    nchunks = padded // cs
    if pos is not None:
        pos = pos.to(buf.device)
    x, residual = _padded_input(state, buf, segments, pos, n, padded)
    xc = x.view(nchunks, cs)
    amax, finite, scale = _agreed_scales(state, xc, group)  # 1) one scale per chunk on every rank
    codes = _stochastic_codes(state, xc, finite, scale, segments, rank)  # 2) seeded stochastic rounding
    if state.error_feedback:
        _keep_residuals(state, xc, codes, scale, finite, residual, segments)
    if not bool(finite.all()):
        state._nonfinite = True
    flat_codes = codes.to(torch.int8).reshape(-1)
    codes8 = flat_codes[:n] if pos is None else flat_codes[pos]  # padding is not sent; bucket order
    state._bytes += amax.numel() * amax.element_size()
    state._fp32_bytes += n * 4
    summed = _exact_sum(state, codes8, world, group)  # 3) exact integer sum across ranks
    state._end_bucket(bucket.is_last())
    nan_rows = ~finite

    def _decode(fut: torch.futures.Future) -> torch.Tensor:
        summed_codes = fut.value()  # int32 sums in bucket order (n elements)
        if isinstance(summed_codes, list):
            summed_codes = summed_codes[0]
        total = torch.zeros(padded, dtype=torch.int32, device=buf.device)
        if pos is None:
            total[:n] = summed_codes
        else:
            total[pos] = summed_codes
        out = total.view(nchunks, cs).to(torch.float32) * (scale / world)
        if bool(nan_rows.any()):
            out[nan_rows] = float("nan")
        flat = out.reshape(-1)
        return (flat[:n] if pos is None else flat[pos]).to(buf.dtype).view_as(buf)

    return summed.then(_decode)


@dataclass
class FP32HookState:
    """State of :func:`fp32_allreduce_hook`: the default all-reduce, with the same byte accounting."""

    process_group: dist.ProcessGroup | None = None
    step: int = 0
    bytes_per_step: list[int] = field(default_factory=list)
    _bytes: int = 0


def fp32_allreduce_hook(state: FP32HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Same result as DDP's default (sum then divide by world size), recording bytes per step."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    state._bytes += buf.numel() * buf.element_size()
    if bucket.is_last():
        state.bytes_per_step.append(state._bytes)
        state._bytes = 0
        state.step += 1
    buf.div_(world)
    work = dist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def all_ranks_finite(model: torch.nn.Module, process_group: dist.ProcessGroup | None = None) -> bool:
    """True iff every gradient of ``model`` is finite on every rank (an all-reduce of one flag).

    Call it after ``backward()`` and before ``optimizer.step()``; all ranks get the same answer,
    so they all skip (or all take) the same step.
    """
    bad = any(p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type != "cpu" and dist.get_backend(process_group) == "gloo":
        device = torch.device("cpu")
    flag = torch.tensor([1.0 if bad else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=process_group)
    return flag.item() == 0.0
