"""A Llama-style decoder (RoPE, grouped-query attention, SwiGLU, RMSNorm): one definition for the IR explorer and the
LLM lab.

Two ways to run it:

- `forward(tokens)`: the plain full-sequence forward (logits for every position). The IR explorer exports this one on
  the meta device; nothing below changes its graph.
- `forward_cached(tokens, input_pos)`: the static KV-cache path of the LLM lab, after `setup_cache(batch, max_seq)`.
  A prefill of P tokens (positions 0..P-1) writes the cache and attends causally among its own tokens; a decode step
  of one token per sequence writes its K/V at `input_pos` and attends over the whole fixed-length cache with a mask.
  Positions come in as a tensor, so every shape is static from one call to the next: torch.compile specialises once
  and a CUDA graph can replay the step. It returns the logits of the last position only (what greedy sampling needs).

`fuse_projections()` concatenates q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj` (gpt-fast's `wqkv`):
the same numbers in fewer, larger matrix products. Both forwards work either way.

Options for real checkpoints (engine.llm.hf maps a Hugging Face config onto them; the presets leave them all off):
q/k/v biases (Qwen2) and an o bias (Llama's attention_bias), an RMSNorm over each q and k head before RoPE (Qwen3),
a head width other than dim / heads, RoPE scaling ('linear', 'llama3'), the LM head tied to the embedding table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 256
    dim: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    seq: int = 16  # the IR's example sequence length, and the length of the RoPE tables
    batch: int = 1
    rope_theta: float = 10000.0
    eps: float = 1e-5
    head_size: int | None = None  # a head width other than dim // heads (Qwen3, some Mistral checkpoints)
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2)
    o_bias: bool = False  # a bias on the output projection (Llama's attention_bias=True: with qkv_bias)
    qk_norm: bool = False  # an RMSNorm over each q and k head before RoPE (Qwen3)
    tie_embeddings: bool = False  # the LM head is the embedding table
    # RoPE frequency scaling as sorted (key, value) pairs: (("factor", 8.0), ("rope_type", "llama3"), ...) or None
    rope_scaling: tuple[tuple[str, Any], ...] | None = None

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.heads


# Shapes only; weights are random with a fixed seed. "1B" is Llama-3.2-1B-shaped (with a 32k vocabulary), "1.1B" is
# TinyLlama-shaped, "7B" is Llama-2-7B-shaped.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab=256, dim=64, layers=2, heads=4, kv_heads=2, ffn=128, seq=16),
    "small": dict(vocab=1024, dim=256, layers=4, heads=8, kv_heads=4, ffn=688, seq=64),
    "1B": dict(vocab=32000, dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192, seq=2048),
    "1.1B": dict(vocab=32000, dim=2048, layers=22, heads=32, kv_heads=4, ffn=5632, seq=2048),
    "7B": dict(vocab=32000, dim=4096, layers=32, heads=32, kv_heads=32, ffn=11008, seq=2048),
}


def preset(name: str, **overrides: Any) -> LlamaConfig:
    if name not in PRESETS:
        raise ValueError(f"no Llama preset {name!r}; presets: {', '.join(PRESETS)}")
    return LlamaConfig(**{**PRESETS[name], **overrides})


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x · rsqrt(mean(x²) + eps) · weight over the last dimension (also the fused GEMV's unfused fallback)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """The rotary frequencies, with the config's scaling ('linear' divides them by its factor; 'llama3' divides the
    low frequencies by the factor and blends the middle band, as Llama 3.1+ does)."""
    head_dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = dict(cfg.rope_scaling or ())
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"RoPE scaling {kind!r} is not supported (default, linear and llama3 are)")


def rope_tables(cfg: LlamaConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles for positions 0..length-1 (float32; the model casts them to its dtype)."""
    inv_freq = rope_inv_freq(cfg)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


class KVCache(nn.Module):
    """Static K/V buffers, (batch, kv_heads, max_seq, head_dim): written in place at the given positions."""

    def __init__(self, batch: int, kv_heads: int, max_seq: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str):
        super().__init__()
        shape = (batch, kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.index_copy_(2, input_pos, k)
        self.v.index_copy_(2, input_pos, v)
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.heads * self.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.heads * self.head_dim, cfg.dim, bias=cfg.o_bias)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's q and k, before RoPE
            self.q_norm: RMSNorm | None = RMSNorm(self.head_dim, cfg.eps)
            self.k_norm: RMSNorm | None = RMSNorm(self.head_dim, cfg.eps)
        else:
            self.q_norm = self.k_norm = None
        self.qkv_proj: nn.Linear | None = None  # set by fuse()
        self.kv_cache: KVCache | None = None  # set by LlamaDecoder.setup_cache()
        # The decode step's attention over the static cache, (q, k_cache, v_cache, input_pos) -> (b, heads, 1, hd);
        # None: SDPA with a mask. The LLM lab's triton-decode mode sets engine.kernels.triton.decode_attention here.
        self.decode_attn: Callable[..., torch.Tensor] | None = None
        # With fused_ops: the decode step's RoPE, cache write and attention from the qkv product's output in one call,
        # (qkv, cos table, sin table, k_cache, v_cache, input_pos) -> (b, heads, 1, hd), writing the cache (the decoder
        # then passes the whole rotary tables as cos and sin). None: separate ops.
        # The triton-fused mode sets engine.kernels.triton.decode_attention.decode_attention_qkv here.
        self.decode_attn_qkv: Callable[..., torch.Tensor] | None = None
        # The decode step's one-row products with the norm before them / the residual after them inside the product
        # (norm_linear(x, norm_w, eps, proj), norm_swiglu(x, norm_w, eps, gate_up_proj) = silu(gate) · up,
        # linear_add(x, proj, residual), each given the projection module, so a quantized one brings its codes and
        # scales); None: the plain modules. Set through LlamaDecoder.set_fused_ops (the LLM lab's triton-fused mode:
        # engine.kernels.triton.gemv.FusedDecodeOps).
        self.fused_ops: Any = None

    def fuse(self) -> None:
        has_bias = self.q_proj.bias is not None
        fused = nn.Linear(self.q_proj.in_features, self.q_proj.out_features + 2 * self.k_proj.out_features,
                          bias=has_bias, device=self.q_proj.weight.device, dtype=self.q_proj.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]))
            if has_bias:
                fused.bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj = fused

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_proj is not None:
            q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
            return self.qkv_proj(x).split([q_out, kv_out, kv_out], dim=-1)
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def _heads(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norm: RMSNorm | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v in heads with RoPE applied; `norm`, when given, is applied to x first (fused into the product for
        one row when fused_ops is set)."""
        b, t, _ = x.shape
        if norm is not None and self.fused_ops is not None and t == 1 and self.qkv_proj is not None:
            q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
            qkv = self.fused_ops.norm_linear(x, norm.weight, norm.eps, self.qkv_proj)
            q, k, v = qkv.split([q_out, kv_out, kv_out], dim=-1)
        else:
            q, k, v = self._qkv(norm(x) if norm is not None else x)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention: share each k/v head between heads // kv_heads query heads."""
        if self.kv_heads == self.heads:
            return x
        b, _, t, d = x.shape
        rep = self.heads // self.kv_heads
        return x[:, :, None].expand(b, self.kv_heads, rep, t, d).reshape(b, self.heads, t, d)

    def _out(self, attn: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The output projection of (b, heads, t, hd), plus `residual` when given."""
        b, _, t, _ = attn.shape
        flat = attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        if residual is None:
            return self.o_proj(flat)
        if self.fused_ops is not None and t == 1:
            return self.fused_ops.linear_add(flat, self.o_proj, residual)
        return residual + self.o_proj(flat)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x, cos, sin)
        out = F.scaled_dot_product_attention(q, self._expand_kv(k), self._expand_kv(v), is_causal=True)
        return self._out(out)

    def forward_cached(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, input_pos: torch.Tensor,
                       mask: torch.Tensor | None, norm: RMSNorm | None = None,
                       residual: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of x (normalised by `norm` first when given) over the static cache, plus `residual` if given."""
        if self.kv_cache is None:
            raise RuntimeError("forward_cached needs a KV cache: call LlamaDecoder.setup_cache(batch, max_seq) first")
        b, t, _ = x.shape
        if t == 1 and self.decode_attn_qkv is not None and self.fused_ops is not None and norm is not None \
                and self.qkv_proj is not None:
            qkv = self.fused_ops.norm_linear(x, norm.weight, norm.eps, self.qkv_proj)
            out = self.decode_attn_qkv(qkv, cos, sin, self.kv_cache.k, self.kv_cache.v, input_pos)
            return self._out(out, residual)
        q, k, v = self._heads(x, cos, sin, norm)
        k_all, v_all = self.kv_cache.update(input_pos, k, v)
        if t > 1:
            # Prefill from position 0: the cache holds exactly these tokens, so causal attention among them is the
            # whole computation (no mask tensor, so every SDPA backend, flash included, applies).
            out = F.scaled_dot_product_attention(q, self._expand_kv(k), self._expand_kv(v), is_causal=True)
            return self._out(out, residual)
        if self.decode_attn is not None:
            return self._out(self.decode_attn(q, k_all, v_all, input_pos), residual)
        # Decode: one query per sequence against the whole static cache, masked beyond input_pos. The query heads
        # that share a k/v head become rows of one head (same position, same mask), so the cache is read as it is,
        # never copied out per query head.
        rep = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(q.reshape(b, self.kv_heads, rep, self.head_dim), k_all, v_all,
                                             attn_mask=mask)
        return self._out(out.reshape(b, self.heads, 1, self.head_dim), residual)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.dim, bias=False)
        self.gate_up_proj: nn.Linear | None = None  # set by fuse()
        self.fused_ops: Any = None  # as Attention.fused_ops

    def fuse(self) -> None:
        fused = nn.Linear(self.gate_proj.in_features, 2 * self.gate_proj.out_features, bias=False,
                          device=self.gate_proj.weight.device, dtype=self.gate_proj.weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([self.gate_proj.weight, self.up_proj.weight]))
        del self.gate_proj, self.up_proj
        self.gate_up_proj = fused

    def forward(self, x: torch.Tensor, norm: RMSNorm | None = None, residual: torch.Tensor | None = None
                ) -> torch.Tensor:
        """SwiGLU of x (normalised by `norm` first when given), plus `residual` when given."""
        if self.fused_ops is not None and norm is not None and residual is not None and self.gate_up_proj is not None \
                and x.shape[-2] == 1:
            hidden = self.fused_ops.norm_swiglu(x, norm.weight, norm.eps, self.gate_up_proj)
            return self.fused_ops.linear_add(hidden, self.down_proj, residual)
        if norm is not None:
            x = norm(x)
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            out = self.down_proj(F.silu(gate) * up)
        else:
            out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out if residual is None else residual + out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_cached(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, input_pos: torch.Tensor,
                       mask: torch.Tensor | None) -> torch.Tensor:
        x = self.self_attn.forward_cached(x, cos, sin, input_pos, mask, norm=self.input_layernorm, residual=x)
        return self.mlp(x, norm=self.post_attention_layernorm, residual=x)


class LlamaDecoder(nn.Module):
    """Token embedding, N pre-norm decoder layers (RoPE, grouped-query causal attention, SwiGLU), RMSNorm, LM head."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(cfg, cfg.seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.max_seq = 0  # the static cache's length once setup_cache ran
        self.fused_ops: Any = None  # see set_fused_ops

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.lm_head(self.norm(h))

    # -- the LLM lab's path: static KV cache ------------------------------------------------------------------------
    def fuse_projections(self) -> None:
        """q/k/v → qkv_proj and gate/up → gate_up_proj in every layer (same weights, concatenated)."""
        for layer in self.layers:
            if layer.self_attn.qkv_proj is None:
                layer.self_attn.fuse()
            if layer.mlp.gate_up_proj is None:
                layer.mlp.fuse()

    def set_fused_ops(self, ops: Any) -> None:
        """Route the decode step's one-row products through `ops` (norm_linear, norm_swiglu, linear_add: the norms,
        the SwiGLU and the residual adds inside the products), or back to the plain modules with None. Needs
        fuse_projections first."""
        if ops is not None:
            if any(layer.self_attn.qkv_proj is None or layer.mlp.gate_up_proj is None for layer in self.layers):
                raise RuntimeError("set_fused_ops needs fused projections: call fuse_projections() first")
            projections = [self.lm_head] + [m for layer in self.layers for m in (
                layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
            # The fused ops read the weight (or a quantized module's codes) and compute x @ W.T: a bias, or a module
            # that does more in its forward (tensor parallel's RowParallelLinear all-reduces its output), would be
            # skipped.
            if any(getattr(m, "bias", None) is not None or getattr(m, "reduce", None) is not None
                   for m in projections):
                raise RuntimeError("set_fused_ops needs bias-free projections that compute x @ W.T alone (no tensor "
                                   "parallel sharding)")
            if self.cfg.qk_norm:
                raise RuntimeError("set_fused_ops does not apply to a model with q/k RMSNorm per head (Qwen3): the "
                                   "fused decode attention applies RoPE to q and k as the product leaves them")
        self.fused_ops = ops
        for layer in self.layers:
            layer.self_attn.fused_ops = ops
            layer.mlp.fused_ops = ops

    def setup_cache(self, batch: int, max_seq: int) -> None:
        """Allocate a static K/V cache of `max_seq` positions per layer (and RoPE tables at least that long)."""
        ref = self.lm_head.weight
        if max_seq > self.rope_cos.shape[0]:
            cos, sin = rope_tables(self.cfg, max_seq)
            self.rope_cos = cos.to(device=ref.device, dtype=self.rope_cos.dtype)
            self.rope_sin = sin.to(device=ref.device, dtype=self.rope_sin.dtype)
        for layer in self.layers:
            attn = layer.self_attn
            attn.kv_cache = KVCache(batch, attn.kv_heads, max_seq, attn.head_dim, ref.dtype, ref.device)
        self.max_seq = max_seq

    def forward_cached(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Logits of the last position, (batch, vocab). `tokens` (batch, t) sit at positions `input_pos` (t,):
        t > 1 is a prefill starting at position 0; t == 1 a decode step."""
        t = tokens.shape[1]
        if t == 1 and self.fused_ops is not None and self.layers[0].self_attn.decode_attn_qkv is not None:
            cos, sin = self.rope_cos, self.rope_sin  # whole tables: the fused attention reads row input_pos itself
        else:
            cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        mask = None
        if t == 1:  # keys at positions <= the current one; the rest of the static cache is not yet written
            mask = (torch.arange(self.max_seq, device=tokens.device) <= input_pos[-1])[None, :]
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = layer.forward_cached(h, cos, sin, input_pos, mask)
        if self.fused_ops is not None and t == 1:
            return self.fused_ops.norm_linear(h[:, -1], self.norm.weight, self.norm.eps, self.lm_head)
        return self.lm_head(self.norm(h[:, -1]))


# Standard deviation of one query/key entry (of a unit-RMS input) in the LLM lab's random models: attention scores
# q·k/√h then have a standard deviation of QK_STD² ≈ 2, so attention picks out a few positions, as a trained
# model's does. With PyTorch's default init the scores are ~0.3: attention is nearly uniform, the logits barely
# depend on positions or on what the cache holds, and a wrong cache slot or position would pass a logits comparison.
QK_STD = 1.5


def build_model(cfg: LlamaConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                seed: int = 0, qk_std: float | None = QK_STD) -> LlamaDecoder:
    """Random weights from `seed`, created directly on `device` in `dtype` (no float32 copy of a 7B model first);
    q and k projections redrawn with entries of std qk_std / √d (see QK_STD; None keeps PyTorch's init)."""
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaDecoder(cfg)
    finally:
        torch.set_default_dtype(old)
    if qk_std is not None:
        with torch.no_grad():
            for layer in model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.weight.normal_(0.0, qk_std / cfg.dim ** 0.5)
    return model.to(dtype).eval()  # the RoPE tables were built in float32: same dtype as the activations now


def parameter_count(cfg: LlamaConfig) -> int:
    """Parameters of the (unfused or fused: the same) model, counted from the shapes (biases, q/k norms and a tied
    LM head as the config says)."""
    hd = cfg.head_dim
    per_layer = (cfg.dim * (cfg.heads + 2 * cfg.kv_heads) * hd + cfg.heads * hd * cfg.dim
                 + 3 * cfg.dim * cfg.ffn + 2 * cfg.dim)
    per_layer += ((cfg.heads + 2 * cfg.kv_heads) * hd if cfg.qkv_bias else 0) + (cfg.dim if cfg.o_bias else 0)
    per_layer += 2 * hd if cfg.qk_norm else 0
    return (cfg.vocab * cfg.dim + cfg.layers * per_layer + cfg.dim
            + (0 if cfg.tie_embeddings else cfg.dim * cfg.vocab))
