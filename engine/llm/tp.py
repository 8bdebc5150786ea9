"""Tensor parallelism (Megatron-style) for the Llama-style decoder of engine/workloads/llama.py.

Every rank holds the full model first (same seed → the same weights everywhere), then `shard_decoder` keeps this
rank's slice of each layer, in place:

    attention  q/k/v (or the fused qkv_proj)   column-parallel: rows of heads rank·H/N … (rank+1)·H/N − 1 and of
                                                k/v heads rank·G/N … (rank+1)·G/N − 1 (the query heads that share a
                                                k/v head stay on the rank that holds it, so GQA needs no exchange)
               o_proj                          row-parallel: the matching input columns; the partial sums of the
                                                ranks are added by one all-reduce
    MLP        gate/up (or gate_up_proj)       column-parallel: rows rank·f/N … (rank+1)·f/N − 1
               down_proj                       row-parallel + one all-reduce
    replicated embed_tokens, lm_head, the RMSNorm weights, the RoPE tables (every rank computes the same logits,
               so each can pick the next token on its own; sharding the vocabulary would need one more exchange)

So a decoder layer costs two all-reduces of its activations (B·t·d elements), one per block half, and the KV cache
of each rank holds only its G/N k/v heads. The model code itself is untouched: the column-parallel projections
are plain nn.Linear layers with fewer output rows, the row-parallel ones are replaced by `RowParallelLinear`, and
the attention modules are told their local head counts.

`AllReduceTimer` measures the time spent inside the all-reduce calls, summed per forward (one prefill or one
decode step). On CUDA a pair of events brackets each call on the compute stream: it includes the wait for the
slowest rank to arrive, which is what the step pays. On the CPU (gloo, a blocking call) perf_counter does the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engine.workloads.llama import KVCache, LlamaConfig, LlamaDecoder

Reduce = Callable[[torch.Tensor], torch.Tensor]


def check_divisible(cfg: LlamaConfig, world_size: int) -> None:
    """ValueError unless heads, k/v heads and the FFN width split evenly over `world_size` ranks."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive whole number, not {world_size!r}")
    for name, value in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("ffn", cfg.ffn)):
        if value % world_size:
            raise ValueError(f"tensor parallelism over {world_size} ranks needs {name} divisible by {world_size}; "
                             f"this model has {name}={value}")


# -- timing the all-reduces -----------------------------------------------------------------------------------------
@dataclass
class _Bucket:
    seconds: float = 0.0  # CPU: perf_counter around each blocking call
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)  # CUDA
    calls: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class StepComm:
    """The all-reduces of one forward: total time inside them (µs), how many, and the bytes reduced per rank."""
    us: float
    calls: int
    bytes: int


class AllReduceTimer:
    """Times every all-reduce the sharded model issues, grouped per forward: `new_step()` opens a group, `take()`
    resolves (one device sync on CUDA) and returns the groups since the last `take()`. Calls outside any group are
    still reduced, just not recorded."""

    def __init__(self, device: str | torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self._buckets: list[_Bucket] = []

    def new_step(self) -> None:
        self._buckets.append(_Bucket())

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        bucket = self._buckets[-1] if self._buckets else None
        if bucket is None:
            dist.all_reduce(tensor, group=group)
            return tensor
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(tensor, group=group)
            end.record()
            bucket.events.append((start, end))
        else:
            t0 = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            bucket.seconds += time.perf_counter() - t0
        bucket.calls += 1
        bucket.bytes += tensor.numel() * tensor.element_size()
        return tensor

    def take(self) -> list[StepComm]:
        if self.cuda and any(b.events for b in self._buckets):
            torch.cuda.synchronize()
        out = [StepComm(us=(sum(s.elapsed_time(e) for s, e in b.events) * 1e3 if self.cuda else b.seconds * 1e6),
                        calls=b.calls, bytes=b.bytes) for b in self._buckets]
        self._buckets = []
        return out


def timed_steps(fn: Callable[..., object], timer: AllReduceTimer) -> Callable[..., object]:
    """`fn` (a prefill or decode step) with a new all-reduce group opened before each call."""
    def step(*args, **kwargs):
        timer.new_step()
        return fn(*args, **kwargs)

    return step


# -- the sharded modules --------------------------------------------------------------------------------------------
class RowParallelLinear(nn.Linear):
    """A row-parallel nn.Linear: this rank's input columns of the full weight; the output (a partial sum) is
    reduced over the ranks before it is returned, and the bias (if any) added once, after the reduction."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int, reduce: Reduce):
        nn.Module.__init__(self)  # no fresh (full-size) weight: this rank's slice of the existing one
        cols = full.in_features // world_size
        self.in_features, self.out_features = cols, full.out_features
        self.weight = nn.Parameter(full.weight.detach()[:, rank * cols:(rank + 1) * cols].contiguous(),
                                   requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(), requires_grad=False)
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, row-parallel (output all-reduced)"


def _keep_rows(linear: nn.Linear, parts: list[tuple[int, int]]) -> None:
    """Column-parallel in place: keep these (start, length) row ranges of the weight, concatenated in order."""
    w = linear.weight.detach()
    linear.weight = nn.Parameter(torch.cat([w[s:s + n] for s, n in parts]).contiguous(), requires_grad=False)
    if linear.bias is not None:
        b = linear.bias.detach()
        linear.bias = nn.Parameter(torch.cat([b[s:s + n] for s, n in parts]).contiguous(), requires_grad=False)
    linear.out_features = linear.weight.shape[0]


def shard_decoder(model: LlamaDecoder, rank: int, world_size: int, group: dist.ProcessGroup | None = None,
                  timer: AllReduceTimer | None = None, reduce: Reduce | None = None) -> LlamaDecoder:
    """Keep rank `rank`'s shard of every decoder layer of the full `model` (fused or unfused projections), in place.

    Heads, k/v heads and the FFN width are split evenly (ValueError otherwise); the embedding, the LM head and the
    norms stay whole on every rank. The row-parallel outputs are summed by `reduce` — by default an all-reduce over
    `group` (through `timer` when given, which then records its time). Passing your own `reduce` lets one process
    hold several shards (tests add the partial outputs by hand). A static KV cache set up before is reallocated for
    the local k/v heads (its contents are dropped). Returns the model."""
    cfg = model.cfg
    check_divisible(cfg, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    if getattr(model, "tp_world_size", 1) != 1:
        raise ValueError("this model is already sharded")
    if reduce is None:
        if timer is not None:
            def reduce(t: torch.Tensor) -> torch.Tensor:
                return timer.all_reduce(t, group)
        else:
            def reduce(t: torch.Tensor) -> torch.Tensor:
                dist.all_reduce(t, group=group)
                return t
    hd = cfg.head_dim
    h_loc, g_loc, f_loc = cfg.heads // world_size, cfg.kv_heads // world_size, cfg.ffn // world_size
    q_rows = (rank * h_loc * hd, h_loc * hd)
    kv_rows = (rank * g_loc * hd, g_loc * hd)
    f_rows = (rank * f_loc, f_loc)
    with torch.no_grad():
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.qkv_proj is not None:  # fused [q; k; v] rows: this rank's part of each, concatenated
                q_out, kv_out = cfg.heads * hd, cfg.kv_heads * hd
                _keep_rows(attn.qkv_proj, [q_rows, (q_out + kv_rows[0], kv_rows[1]),
                                           (q_out + kv_out + kv_rows[0], kv_rows[1])])
            else:
                _keep_rows(attn.q_proj, [q_rows])
                _keep_rows(attn.k_proj, [kv_rows])
                _keep_rows(attn.v_proj, [kv_rows])
            attn.o_proj = RowParallelLinear(attn.o_proj, rank, world_size, reduce)
            attn.heads, attn.kv_heads = h_loc, g_loc  # Attention reads these for its views and its GQA grouping
            if mlp.gate_up_proj is not None:  # fused [gate; up]
                _keep_rows(mlp.gate_up_proj, [f_rows, (cfg.ffn + f_rows[0], f_rows[1])])
            else:
                _keep_rows(mlp.gate_proj, [f_rows])
                _keep_rows(mlp.up_proj, [f_rows])
            mlp.down_proj = RowParallelLinear(mlp.down_proj, rank, world_size, reduce)
            if attn.kv_cache is not None:
                old = attn.kv_cache.k
                batch, _, max_seq, _ = old.shape
                attn.kv_cache = KVCache(batch, g_loc, max_seq, hd, old.dtype, old.device)
    model.tp_rank, model.tp_world_size = rank, world_size
    return model


def shard_parameter_count(model: nn.Module) -> int:
    """Parameters this rank holds (the replicated embedding and LM head included)."""
    return sum(p.numel() for p in model.parameters())
