"""FLOP and byte counts of the Llama-style decoder, and the utilisation figures built on them.

Counted analytically from the shapes (no profiler involved), so each figure can be checked by hand. Notation:
B batch, P prompt length, d model width, L layers, H query heads, G k/v heads, h = d / H head width, f FFN width,
V vocabulary, s bytes per element (2 for bf16, 4 for fp32); a multiply-add is 2 FLOPs.

Prefill of P tokens (what `forward_cached` computes; the LM head runs on the last position only):
    per layer, matmuls   2·B·P·(d·(H + 2G)·h  +  H·h·d  +  3·d·f)        q/k/v, o, gate/up/down projections
    per layer, attention 2·B·H·h·P·(P + 1)                               QKᵀ and PV over the causal half: query i
                                                                          meets keys 0..i, P(P+1)/2 pairs, 2 matmuls
    LM head              2·B·d·V
    Left out: RMSNorm, RoPE, softmax, SiLU and the residual adds (O(B·P·d) each, well under 1 % at these sizes),
    and the embedding lookup (a gather, no arithmetic).

Decode step with n tokens in the cache (the new one included; n = P + i + 1 at step i):
    FLOPs  L·(2·B·(d·(H + 2G)·h + H·h·d + 3·d·f)  +  4·B·H·h·n)  +  2·B·d·V
    bytes  weights  s·(L·(d·(H + 2G)·h + H·h·d + 3·d·f + 2·d) + d + d·V)  +  s·B·d
                    (every weight once, plus the B embedding rows looked up; the rest of the table is not read)
           KV read  s·L·2·B·G·h·n                                              (every cached K and V, once)
    Left out: activations (O(B·d) per layer) and the K/V write of the new token (s·L·2·B·G·h): kilobytes against
    gigabytes of weights.

Prefill bytes (the fewest a prefill can move, for the roofline): the weights once, plus the K/V it writes,
s·L·2·B·G·h·P. Activations are left out: streamed through, they need not all reach memory.

Utilisation:
    MFU = prefill FLOPs / TTFT / peak FLOP/s       (peak: the lab's measured bf16 — or fp32 — matmul rate; the
                                                     datasheet's dense peak is reported beside it, named as such)
    MBU = mean decode bytes per step / median TPOT / measured copy bandwidth  (read + write of a large copy)
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.workloads.llama import LlamaConfig


def _linear_params_per_layer(cfg: LlamaConfig) -> int:
    hd = cfg.head_dim
    return cfg.dim * (cfg.heads + 2 * cfg.kv_heads) * hd + cfg.heads * hd * cfg.dim + 3 * cfg.dim * cfg.ffn


def matmul_flops_per_token(cfg: LlamaConfig) -> int:
    """Projection FLOPs of one token through all layers (no attention, no LM head): 2·L·(linear params per layer)."""
    return 2 * cfg.layers * _linear_params_per_layer(cfg)


def prefill_attention_flops(cfg: LlamaConfig, batch: int, prompt_len: int) -> int:
    """QKᵀ and PV over the causal half, every layer: L · 2·B·H·h·P·(P+1)."""
    return cfg.layers * 2 * batch * cfg.heads * cfg.head_dim * prompt_len * (prompt_len + 1)


def lm_head_flops(cfg: LlamaConfig, batch: int) -> int:
    return 2 * batch * cfg.dim * cfg.vocab


def prefill_flops(cfg: LlamaConfig, batch: int, prompt_len: int) -> int:
    """Matmuls + attention per layer, plus the LM head on the last position."""
    return (batch * prompt_len * matmul_flops_per_token(cfg) + prefill_attention_flops(cfg, batch, prompt_len)
            + lm_head_flops(cfg, batch))


def decode_flops(cfg: LlamaConfig, batch: int, context: int) -> int:
    """One decode step with `context` tokens in the cache (the new one included)."""
    attention = cfg.layers * 4 * batch * cfg.heads * cfg.head_dim * context
    return batch * matmul_flops_per_token(cfg) + attention + lm_head_flops(cfg, batch)


def weight_bytes(cfg: LlamaConfig, batch: int, bytes_per_elem: int) -> int:
    """Every weight read once per step, except the embedding table: only its B looked-up rows."""
    per_layer = _linear_params_per_layer(cfg) + 2 * cfg.dim  # + the two RMSNorm weights
    params = cfg.layers * per_layer + cfg.dim + cfg.dim * cfg.vocab  # + final norm + LM head
    return bytes_per_elem * (params + batch * cfg.dim)


def kv_bytes(cfg: LlamaConfig, batch: int, tokens: int, bytes_per_elem: int) -> int:
    """K and V of `tokens` positions in every layer."""
    return bytes_per_elem * cfg.layers * 2 * batch * cfg.kv_heads * cfg.head_dim * tokens


def decode_bytes(cfg: LlamaConfig, batch: int, context: int, bytes_per_elem: int) -> int:
    """Bytes a decode step must move: the weights plus the K/V cache read so far (`context` tokens)."""
    return weight_bytes(cfg, batch, bytes_per_elem) + kv_bytes(cfg, batch, context, bytes_per_elem)


def prefill_bytes(cfg: LlamaConfig, batch: int, prompt_len: int, bytes_per_elem: int) -> int:
    """The fewest bytes a prefill moves: the weights once and the K/V cache it writes."""
    return weight_bytes(cfg, batch, bytes_per_elem) + kv_bytes(cfg, batch, prompt_len, bytes_per_elem)


@dataclass(frozen=True)
class PhaseCounts:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        return self.flops / self.bytes if self.bytes else 0.0


def prefill_counts(cfg: LlamaConfig, batch: int, prompt_len: int, bytes_per_elem: int) -> PhaseCounts:
    return PhaseCounts(prefill_flops(cfg, batch, prompt_len), prefill_bytes(cfg, batch, prompt_len, bytes_per_elem))


def decode_counts(cfg: LlamaConfig, batch: int, prompt_len: int, steps: int, bytes_per_elem: int) -> PhaseCounts:
    """Mean per step over `steps` decode steps after a prompt of `prompt_len` (step i has P + i + 1 in the cache)."""
    if steps < 1:
        raise ValueError("decode needs at least one step")
    contexts = [prompt_len + i + 1 for i in range(steps)]
    flops = sum(decode_flops(cfg, batch, n) for n in contexts) / steps
    moved = sum(decode_bytes(cfg, batch, n, bytes_per_elem) for n in contexts) / steps
    return PhaseCounts(flops, moved)


def utilisation(work: float, seconds: float, ceiling: float | None) -> float | None:
    """Percent of a ceiling achieved: work / seconds / ceiling × 100 (None without a ceiling or a time)."""
    if not ceiling or not seconds or seconds <= 0:
        return None
    return 100.0 * work / seconds / ceiling
