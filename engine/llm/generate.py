"""Greedy generation with the static KV cache: one prefill, then one decode step per new token.

    prefill(tokens (B, P), positions 0..P-1)  → (next token (B, 1), last-position logits (B, V))
    decoder.reset(token, P); decoder.step() × N → each step feeds the current token at the current position

The step callables come from engine.llm.modes (eager, compiled, CUDA-graphed); the decoders here drive them. Each
decoder keeps the current token and position in device tensors it updates in place, so the host never waits on the
device inside the loop, and every call sees tensors of the same shapes (what torch.compile and CUDA graphs need).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.workloads.llama import LlamaDecoder

StepFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely next token per sequence, (B, 1)."""
    return logits.argmax(dim=-1, keepdim=True)


def step_fn(model: LlamaDecoder, pick: Callable[[torch.Tensor], torch.Tensor] = greedy) -> StepFn:
    """(tokens, positions) → (greedy next token, last-position logits): the function prefill and decode compile.
    `pick` takes the next token from the logits (B, V) → (B, 1): torch's argmax unless a mode says otherwise."""
    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model.forward_cached(tokens, input_pos)
        return pick(logits), logits

    return step


def pick_into_after(forward: StepFn, pick_into: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
                    ) -> StepFn:
    """A step whose next token is taken from the logits `forward` returns (forward's own token dropped) by a pick
    kept out of a compiled forward, while a CUDA graph still captures both; the pick writes it into the step's own
    token buffer and moves its position one on (pick_into(logits, tokens, input_pos):
    engine.kernels.triton.argmax.argmax_rows_into), for a decoder built with advances=True — the token copy and the
    position add are then no kernels of their own."""
    def step(tokens: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, logits = forward(tokens, input_pos)
        pick_into(logits, tokens, input_pos)
        return tokens, logits

    return step


class Decoder:
    """Calls a decode step function once per token: the eager and compiled (incl. reduce-overhead) modes.
    advances: the step function itself writes the next token into the token buffer it is given and moves the
    position one on (pick_into_after); otherwise the decoder copies the token it returns and adds one."""

    def __init__(self, fn: StepFn, before_step: Callable[[], None] | None = None, advances: bool = False):
        self.fn = fn
        self.before_step = before_step
        self.advances = advances
        self.token: torch.Tensor | None = None
        self.pos: torch.Tensor | None = None

    def reset(self, token: torch.Tensor, pos: int) -> None:
        """Start from `token` (B, 1) at position `pos` (the first position after the prompt)."""
        if self.token is None or self.token.shape != token.shape:
            self.token = torch.empty_like(token)
            self.pos = torch.empty(1, dtype=torch.long, device=token.device)
        self.token.copy_(token)
        self.pos.fill_(pos)

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step; returns (next token, logits), valid until the next step (copy them to keep them)."""
        if self.before_step is not None:
            self.before_step()  # reduce-overhead: a new iteration of the CUDA graph tree
        nxt, logits = self.fn(self.token, self.pos)
        # Into our own buffers, not the step's outputs: a CUDA graph tree reuses its output memory on the next replay.
        self._advance(nxt)
        return self.token, logits

    def _advance(self, nxt: torch.Tensor) -> None:
        """The next token into the token buffer and the position one on, unless the step did both (advances)."""
        if not self.advances:
            self.token.copy_(nxt)
            self.pos.add_(1)

    def recapture(self) -> None:
        """Nothing recorded here to drop (GraphDecoder's graph is)."""


class GraphDecoder(Decoder):
    """gpt-fast's decode loop: the whole step (forward, argmax, token and position update) captured once into one
    CUDA graph over static buffers, then replayed once per token. No Python runs per step but `replay()`."""

    def __init__(self, fn: StepFn, warmup: int = 3, advances: bool = False):
        super().__init__(fn, advances=advances)
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def _body(self) -> torch.Tensor:
        nxt, logits = self.fn(self.token, self.pos)
        self._advance(nxt)
        return logits

    def reset(self, token: torch.Tensor, pos: int) -> None:
        if self.graph is None or self.token.shape != token.shape:
            super().reset(token, pos)
            # Warm up on a side stream (compilation, cuBLAS handles, autotuning happen here), then capture. The
            # warm-up steps write K/V at positions pos, pos+1, …; the real steps overwrite them.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(self.warmup):
                    self._body()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._body()
        self.token.copy_(token)
        self.pos.fill_(pos)

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.graph.replay()
        return self.token, self.logits

    def recapture(self) -> None:
        """Drop the graph: the next reset() warms up and captures again (after the kernels the step calls changed,
        e.g. once deferred GEMV tuning has run)."""
        self.graph = None


@dataclass
class Generation:
    tokens: torch.Tensor  # (B, 1 + steps): the prefill's token, then one per decode step
    logits: list[torch.Tensor] = field(default_factory=list)  # per position, (B, V), float32 on the CPU


def generate(prefill: StepFn, decoder: Decoder, prompt: torch.Tensor, steps: int) -> Generation:
    """Greedy: prefill the prompt, then `steps` decode steps; tokens and logits copied out at every step."""
    b, p = prompt.shape
    positions = torch.arange(p, device=prompt.device)
    token, logits = prefill(prompt, positions)
    out = [token.clone()]
    kept = [logits.detach().float().cpu()]
    decoder.reset(token, p)
    for _ in range(steps):
        token, logits = decoder.step()
        out.append(token.clone())
        kept.append(logits.detach().float().cpu())
    return Generation(tokens=torch.cat(out, dim=1), logits=kept)


@torch.no_grad()
def recompute_generate(model: LlamaDecoder, prompt: torch.Tensor, steps: int) -> Generation:
    """The same greedy run without a cache: the plain forward over the whole sequence for every token (the
    reference the static cache must reproduce; quadratic, for small models)."""
    seq = prompt
    out, kept = [], []
    for _ in range(steps + 1):
        logits = model(seq)[:, -1]
        token = greedy(logits)
        out.append(token)
        kept.append(logits.float().cpu())
        seq = torch.cat([seq, token], dim=1)
    return Generation(tokens=torch.cat(out, dim=1), logits=kept)
