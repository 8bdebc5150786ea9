"""Planted cheats for causal_attention at its small CPU shape: each must fail its run or be flagged by the guards.
side_stream and unordered_stream only mean something on CUDA (their tests skip on the CPU, saying why)."""

from __future__ import annotations

import _thread
import threading
import time

import torch
import torch.nn.functional as F
from user_attention import attention

NOT_CALLABLE = 3
_memo: dict[tuple, torch.Tensor] = {}
_stale: dict[tuple, torch.Tensor] = {}


def writes_input(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Right answer, but scales q in place as scratch (a second call on the same inputs would be wrong)."""
    out = attention(q, k, v)
    q.mul_(0.5)
    return out


def memoised(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Returns the same output tensor whenever it sees the same input buffers again."""
    key = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    if key not in _memo:
        _memo[key] = attention(q, k, v)
    return _memo[key]


def constant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The first answer it computed for this shape, copied out on every later call: right on the first inputs only."""
    key = tuple(q.shape)
    if key not in _stale:
        _stale[key] = attention(q, k, v)
    return _stale[key].clone()


def fp16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Computes in fp16 when fp32 was asked."""
    return attention(q.half(), k.half(), v.half()).float()


def background_thread(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Returns an empty tensor at once and fills it from a host thread: the timed call does no work."""
    out = torch.empty_like(q)
    threading.Thread(target=lambda: out.copy_(attention(q, k, v)), daemon=True).start()
    return out


def spins_after(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Right answer, but leaves raw threads (_thread, unseen by the threads guard) computing for 0.3 s after it
    returns: work that a timer which stops at the return never sees. Four threads of matmuls (which release the GIL,
    so they run on every core at once): on a loaded 2-core machine one pure-Python spinner got too little CPU to
    show."""
    def spin(until: float) -> None:
        a = torch.randn(192, 192)
        while time.perf_counter() < until:
            a = torch.tanh(a @ a)

    until = time.perf_counter() + 0.3
    for _ in range(4):
        _thread.start_new_thread(spin, (until,))
    return attention(q, k, v)


def side_stream(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """CUDA only: runs the work on another stream that the caller's stream never waits for. The side stream waits for
    the caller's (so it reads finished inputs and the answer is right); the caller's events bracket nothing."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # SDPA: accurate at bf16 (plain bf16 torch math fails the precision guard first)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def unordered_stream(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """CUDA only: the work on another stream that neither waits for the caller's stream nor is waited for — its
    time lies outside the caller's events, and its inputs may not even be ready when it starts."""
    with torch.cuda.stream(torch.cuda.Stream()):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def wrong_signature(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q


def raises(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel launch failed: out of shared memory")
