"""Weight-only quantization (engine/llm/quant.py): pack/unpack and dequantize round trips, the cache, the model
swap, the accuracy gate (and that it fails on an injected wrong scale), the quantized LLM modes on the tiny decoder
(plain and Triton, interpreted on CPU), and the bytes a quantized decode step moves."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton and the kernels load (the triton-* modes)

from engine.llm import metrics, modes, quant  # noqa: E402
from engine.llm.generate import Decoder, generate, step_fn  # noqa: E402
from engine.measure.checks import ToleranceError  # noqa: E402
from engine.workloads.llama import LlamaConfig, build_model, preset  # noqa: E402

SCHEMES = list(quant.SCHEMES)
pytestmark = pytest.mark.gpu  # the triton-* modes compiled on a GPU, interpreted without one


def _interpreted(kernel: object) -> bool:
    """The kernel runs in Triton's interpreter, and so does triton.language itself (tl.zeros is a jit function too:
    a triton imported before TRITON_INTERPRET=1, by an earlier test module, cannot run an interpreted kernel)."""
    import triton.language as tl

    from engine.kernels.triton._common import is_interpreted

    return is_interpreted(kernel) and is_interpreted(tl.standard.zeros)


@pytest.fixture(autouse=True)
def _own_build_dir(tmp_path, monkeypatch) -> Iterator[None]:
    """The on-disk quantization cache (under build_root()) in this test's folder, the in-process one empty."""
    monkeypatch.setenv("MODELAB_BUILD_DIR", str(tmp_path / "build"))
    quant.clear_memory_cache()
    yield
    quant.clear_memory_cache()


def _weight(n: int = 12, k: int = 133, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


def test_int4_pack_unpack_round_trip_ragged_k() -> None:
    codes = torch.randint(0, 16, (5, 131), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    packed = quant.pack_int4(codes)
    assert packed.shape == (5, 96) and packed.dtype == torch.uint8  # 3 whole groups of 64, 32 bytes each
    assert torch.equal(quant.unpack_int4(packed, 131), codes)
    # word t of a group holds k = 8·j + t in nibble j: byte 0 = k 0 (low) and k 8 (high); byte 5 = k 17 and k 25
    assert int(packed[0, 0]) == int(codes[0, 0]) | (int(codes[0, 8]) << 4)
    assert int(packed[2, 5]) == int(codes[2, 17]) | (int(codes[2, 25]) << 4)
    assert int(packed[0, 32 + 3]) == int(codes[0, 64 + 48]) | (int(codes[0, 64 + 56]) << 4)
    # the padding (k 131 … 191) is code 8: the value 0
    assert quant.unpack_int4(packed, 192)[:, 131:].eq(8).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_is_within_half_a_step(scheme: str, dtype: torch.dtype) -> None:
    w = _weight().to(dtype)
    qw = quant.quantize(w, scheme)
    assert qw.shape == (12, 133) and qw.scales.dtype == torch.bfloat16
    back = quant.dequantize(qw, torch.float32)
    err = (back - w.float()).abs()
    if scheme == "int4-wo":
        assert qw.q.shape == (12, 96) and qw.scales.shape == (12, 3)  # 133 = 64 + 64 + 5: 3 groups, 32 bytes each
        step = qw.scales.float().repeat_interleave(64, dim=1)[:, :133]
        assert bool((err <= step / 2 + 1e-6).all())
        assert int(quant.unpack_int4(qw.q, 133).min()) >= 1  # symmetric: code 0 (−8) never produced
    elif scheme == "int8-wo":
        assert qw.q.dtype == torch.int8 and int(qw.q.abs().max()) == 127
        assert bool((err <= qw.scales.float()[:, None] / 2 + 1e-6).all())
    else:
        assert qw.q.dtype == torch.float8_e4m3fn
        assert float((err / w.float().abs().clamp_min(1e-3)).median()) < 2 ** -4  # 3 mantissa bits
        # fp8 codes pack and unpack exactly through their bytes
        assert torch.equal(qw.q.view(torch.uint8).view(torch.float8_e4m3fn).float(), qw.q.float())
    assert quant.dequantize(qw, torch.bfloat16).dtype == torch.bfloat16


def test_the_cache_keys_on_weights_and_scheme_and_keeps_a_disk_copy(tmp_path) -> None:
    w = _weight(seed=5)
    first, src = quant.quantize_cached(w, "int8-wo")
    assert src == "quantized" and list((tmp_path / "build" / "quant").glob("*.pt"))
    again, src = quant.quantize_cached(w, "int8-wo")
    assert src == "memory" and torch.equal(again.q, first.q) and again.q.data_ptr() != first.q.data_ptr()
    assert quant.quantize_cached(w, "int4-wo")[1] == "quantized"  # another scheme, another key
    assert quant.quantize_cached(w + 1e-3, "int8-wo")[1] == "quantized"  # other weights, another key
    quant.clear_memory_cache()
    loaded, src = quant.quantize_cached(w, "int8-wo")
    assert src == "disk" and torch.equal(loaded.q, first.q) and torch.equal(loaded.scales, first.scales)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_weight_on_the_gpu_is_quantized_there_and_not_cached(tmp_path) -> None:
    w = _weight(seed=5).cuda()
    first, src = quant.quantize_cached(w, "int4-wo")
    again, src_again = quant.quantize_cached(w, "int4-wo")
    assert src == src_again == "quantized" and first.q.is_cuda
    assert torch.equal(first.q, again.q) and torch.equal(first.scales, again.scales)
    assert not list((tmp_path / "build" / "quant").glob("*.pt"))


def test_side_by_side_quantizers_of_one_weight_all_write_the_disk_cache(tmp_path, monkeypatch) -> None:
    """Runs of a group prepare side by side and quantize the same weights: each writer keeps its own temporary file
    (with one shared name the first rename would take the others' file away)."""
    import threading

    class NoMemory(dict):  # every thread misses the in-process cache, as separate processes do
        def __contains__(self, key: object) -> bool:
            return False

    monkeypatch.setattr(quant, "_CACHE", NoMemory())
    w, barrier, errors = _weight(seed=7), threading.Barrier(8), []

    def quantize() -> None:
        barrier.wait()
        try:
            for _ in range(3):
                quant.quantize_cached(w, "int8-wo")
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=quantize) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(list((tmp_path / "build" / "quant").glob("*.pt"))) == 1
    assert not list((tmp_path / "build" / "quant").glob("*.tmp"))


def _tiny(seed: int = 0, dtype: torch.dtype = torch.float32, steps: int = 24):
    cfg = preset("tiny")
    model = build_model(cfg, "cpu", dtype, seed)
    model.setup_cache(1, 16 + steps + 1)
    prompt = torch.randint(0, cfg.vocab, (1, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = generate(step_fn(model), Decoder(step_fn(model)), prompt, steps)
    return model, prompt, ref


def test_quantize_model_swaps_the_layer_linears_and_the_lm_head_where_the_scheme_says() -> None:
    model, _, _ = _tiny()
    head, embed = model.lm_head.weight.clone(), model.embed_tokens.weight.clone()
    report = quant.quantize_model(model, "int4-wo", disk_cache=False)
    assert report.layers == 7 * model.cfg.layers + 1 and report.seconds >= 0
    assert report.bytes_after < report.bytes_before / 3
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert isinstance(model.lm_head, quant.QuantLinear) and model.lm_head.scheme == "int4-wo"
    assert torch.equal(quant.quantize(head, "int4-wo").q, model.lm_head.q)  # from the head's own weights
    assert torch.equal(model.embed_tokens.weight, embed)
    assert "int4-wo" in report.note() and "LM head among them" in report.note()
    kept = dict(quant.QUANTIZE_LM_HEAD, **{"int8-wo": False})  # a scheme that keeps its head: layers only
    plain_model, _, _ = _tiny()
    import unittest.mock

    with unittest.mock.patch.dict(quant.QUANTIZE_LM_HEAD, kept):
        report = quant.quantize_model(plain_model, "int8-wo", disk_cache=False)
        assert "LM head kept" in report.note()
    assert report.layers == 7 * plain_model.cfg.layers and type(plain_model.lm_head) is torch.nn.Linear


def test_the_gate_passes_int8_and_fails_on_an_injected_wrong_scale() -> None:
    model, prompt, ref = _tiny(seed=1)
    quant.quantize_model(model, "int8-wo", disk_cache=False)
    passed = quant.gate_model(model, prompt, ref.tokens, ref.logits, "int8-wo")
    assert passed.passed and passed.top1 >= 0.85 and passed.positions == 25
    with torch.no_grad():
        model.layers[0].mlp.down_proj.scales.mul_(4)  # one layer's scales wrong by 4×
    with pytest.raises(ToleranceError, match=r"top-1 agreement 0\.\d+ .*mean KL 0\.01\d+"):
        quant.gate_model(model, prompt, ref.tokens, ref.logits, "int8-wo")
    for scheme in SCHEMES:  # past every scheme's gate (its KL, at least)
        with pytest.raises(ToleranceError):
            quant.gate_model(model, prompt, ref.tokens, ref.logits, scheme)


def test_the_gate_follows_the_models_depth() -> None:
    """Quantization error compounds with depth on random weights, so the gates are calibrated per depth: a KL that
    fails a 2-layer model's int4 gate passes a 16-layer one's; depths between calibrated presets take the deeper."""
    ref = [torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0]])] * 4
    got = [r + torch.tensor([[0.0, 0.2, -0.2, 0.2, -0.2, 0.0]]) for r in ref]
    top1, kl, _ = quant.gate_metrics(ref, got)
    assert top1 == 1.0 and quant.GATES["int4-wo"].max_kl < kl < quant.DEEP_GATES[16]["int4-wo"].max_kl
    with pytest.raises(ToleranceError, match="int4-wo"):
        quant.check_gate("int4-wo", ref, got, layers=2)
    assert quant.check_gate("int4-wo", ref, got, layers=16).passed
    assert quant.gate_for("fp8-wo", 4) is quant.GATES["fp8-wo"]
    assert quant.gate_for("fp8-wo", 5) is quant.gate_for("fp8-wo", 16) is quant.DEEP_GATES[16]["fp8-wo"]
    assert quant.gate_for("fp8-wo", 22) is quant.gate_for("fp8-wo", 80) is quant.DEEP_GATES[32]["fp8-wo"]
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        quant.gate_for("int3-wo", 16)


def test_the_gate_takes_a_batch_through_the_models_own_cache() -> None:
    cfg = preset("tiny")
    model = build_model(cfg, "cpu", torch.float32, 4)
    model.setup_cache(2, 24)
    prompt = torch.randint(0, cfg.vocab, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = generate(step_fn(model), Decoder(step_fn(model)), prompt, 4)
        quant.quantize_model(model, "fp8-wo")
        gate = quant.gate_model(model, prompt, ref.tokens, ref.logits, "fp8-wo")
    assert gate.passed and gate.positions == 2 * 5


def test_gate_metrics_on_known_logits() -> None:
    ref = [torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]])]
    assert quant.gate_metrics(ref, ref) == (1.0, 0.0, 2)
    top1, kl, n = quant.gate_metrics(ref, [ref[0], torch.tensor([[1.0, 0.0, 0.0]])])
    p = torch.tensor([0.0, 1.0, 0.0]).double().softmax(-1)
    q = torch.tensor([1.0, 0.0, 0.0]).double().softmax(-1)
    assert top1 == 0.5 and n == 2 and kl == pytest.approx(float((p * (p / q).log()).sum()) / 2)


@pytest.mark.parametrize("name", [f"{impl}{s}" for impl in ("", "triton-") for s in SCHEMES])
def test_each_quantized_mode_decodes_the_tiny_model_within_its_gate(name: str) -> None:
    mode = modes.get_mode(name)
    if mode.quant_impl == "triton":
        from engine.kernels.triton.decode_attention import decode_attention_qkv  # noqa: F401 - its kernels
        from engine.kernels.triton.quant_gemv import _wo_channel_kernel

        if not _interpreted(_wo_channel_kernel):  # on a GPU machine: the fused step's attention has no CPU path
            pytest.skip("the Triton kernels are compiled, not interpreted (TRITON_INTERPRET=1 unset): a CPU run of "
                        "the fused quantized step needs the interpreter")
    steps = 4 if mode.quant_impl == "triton" else 8  # the interpreter runs every program of every GEMV in Python
    model, prompt, ref = _tiny(seed=2, steps=steps)
    with torch.no_grad():
        prepared = modes.prepare(mode, model, "cpu")
        assert any(mode.quant in n for n in prepared.notes)
        assert all(isinstance(m, quant.QuantLinear) and m.impl == mode.quant_impl
                   for m in model.layers.modules() if isinstance(m, (torch.nn.Linear, quant.QuantLinear)))
        got = generate(prepared.prefill, prepared.decoder, prompt, 1)  # the mode's own prefill and decoder run
        assert got.tokens.shape == (1, 2) and torch.isfinite(got.logits[-1]).all()
        # the gate: teacher-forced on the reference's tokens (a free-running greedy run would compare different
        # contexts after its first flip)
        gate = quant.gate_model(model, prompt, ref.tokens, ref.logits, mode.quant, name)
    assert gate.passed and gate.positions == steps + 1
    if mode.quant_impl == "triton":  # the kernels compute what the plain dequantization computes
        plain = [torch.nn.functional.linear(torch.ones(1, m.in_features), quant.dequantize(m.weight_()))
                 for m in model.layers.modules() if isinstance(m, quant.QuantLinear)][:2]
        fused = [m(torch.ones(1, m.in_features)) for m in model.layers.modules()
                 if isinstance(m, quant.QuantLinear)][:2]
        for a, b in zip(fused, plain):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["int4-wo", "triton-int4-wo"])
def test_a_quantized_step_compiles_without_a_graph_break(name: str) -> None:
    """What the CUDA modes compile (dynamo fullgraph; aot_eager here): the plain dequantization and the custom ops."""
    mode = modes.get_mode(name)
    if mode.quant_impl == "triton":
        from engine.kernels.triton.quant_gemv import _wo_int4_kernel

        if not _interpreted(_wo_int4_kernel):  # on a GPU machine: the fused step's attention has no CPU path
            pytest.skip("the Triton kernels are compiled, not interpreted (TRITON_INTERPRET=1 unset): a CPU run of "
                        "the fused quantized step needs the interpreter")
    model, prompt, _ = _tiny(seed=3, steps=2)
    with torch.no_grad():
        modes.prepare(mode, model, "cpu")
        eager = generate(step_fn(model), Decoder(step_fn(model)), prompt, 2)
        compiled = torch.compile(step_fn(model), fullgraph=True, backend="aot_eager")
        got = generate(compiled, Decoder(compiled), prompt, 2)
    assert torch.equal(got.tokens, eager.tokens)
    assert max(float((a - b).abs().max()) for a, b in zip(got.logits, eager.logits)) < 1e-5


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_labs_compiled_prefill_forms_its_weight_with_the_kernel(scheme: str) -> None:
    """The lab's compiled prefill traces the triton_op (quant_dequantize) into its graph and multiplies by the same
    weight, bit for bit, as the eager layer."""
    from engine.kernels.choice import QUANT_ROWS_MAX_BATCH

    layer = quant.QuantLinear(quant.quantize(_weight(48, 200), scheme), impl="triton", dtype=torch.float32)
    # a prefill's rows: more than a decode step's that int4 sends to its rows kernel
    x = torch.randn(QUANT_ROWS_MAX_BATCH + 5, 200, generator=torch.Generator().manual_seed(1))
    graphs: list[str] = []

    def record(gm, _inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    with torch.no_grad():
        eager = layer(x)
        torch._dynamo.reset()
        got = torch.compile(layer, backend=record, fullgraph=True)(x)
    torch._dynamo.reset()
    assert torch.equal(got, eager)
    assert "quant_dequantize" in graphs[0], graphs[0]


def test_the_plain_way_compiles_its_decode_step_as_gpt_fast_does(monkeypatch) -> None:
    """gpt-fast turns coordinate-descent tuning on; the plain quantized modes set it for their compile only (with
    whatever the compile mode sets), and nothing else's compile gets it."""
    calls: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    modes._compile(lambda x: x, None, fuse_gemv_loads=True)
    modes._compile(lambda x: x, "max-autotune-no-cudagraphs", fuse_gemv_loads=True)
    modes._compile(lambda x: x, None)
    assert calls[0]["options"] == {"coordinate_descent_tuning": True} and "mode" not in calls[0]
    assert calls[1]["options"]["max_autotune"] and calls[1]["options"]["coordinate_descent_tuning"]
    assert calls[2]["mode"] is None and "options" not in calls[2]
    assert all(c["fullgraph"] and c["dynamic"] is False for c in calls)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's one-row decomposition is for GPUs")
def test_the_plain_way_dequantizes_inside_the_products_loads_on_a_gpu() -> None:
    """Compiled as the plain modes compile their decode step, a one-row product over int8 codes is one reduction
    kernel that reads the codes: no cuBLAS mm over a dequantized weight written first."""
    from torch._inductor.utils import run_and_get_code

    w = torch.randn(512, 256, device="cuda")
    qw = quant.quantize(w, "int8-wo")
    layer = quant.QuantLinear(qw.to("cuda"), "plain").cuda()
    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    step = modes._compile(layer, None, fuse_gemv_loads=True)
    with torch.no_grad():
        out, code = run_and_get_code(step, x)
    assert "extern_kernels.mm" not in "\n".join(code)
    ref = x.double() @ quant.dequantize(qw, torch.float64).cuda().T
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-2


def test_quantized_modes_declared_with_reasons() -> None:
    for name in ("int8-wo", "fp8-wo", "int4-wo", "triton-int8-wo", "triton-fp8-wo", "triton-int4-wo"):
        assert modes.MODES[name].quant
    assert modes.availability(modes.MODES["int8-wo"], "cpu", torch.float32) is None
    eager = modes.on_device(modes.MODES["int4-wo"], "cpu")
    assert (eager.prefill, eager.decode) == ("eager", "eager")
    assert modes.on_device(modes.MODES["int4-wo"], "cuda").decode == "cudagraph"
    if not torch.cuda.is_available():
        assert "no CUDA device" in modes.availability(modes.MODES["fp8-wo"], "cuda", torch.bfloat16)


def test_decode_bytes_per_token_against_a_hand_count() -> None:
    cfg = LlamaConfig(vocab=100, dim=128, layers=2, heads=4, kv_heads=2, ffn=200)  # head_dim 32
    # per layer: q 128×128, k and v 64×128, o 128×128, gate and up 200×128, down 128×200
    weights_per_layer = 128 * 128 + 2 * 64 * 128 + 128 * 128 + 2 * 200 * 128 + 128 * 200
    rows_per_layer = 128 + 2 * 64 + 128 + 2 * 200 + 128  # output channels
    rest = (2 * 2 + 1) * 128 * 2 + 3 * 128 * 2  # norms, B = 3 embedding rows (bf16)
    kv = 2 * 2 * 3 * 2 * 32 * 10 * 2  # layers · (K, V) · B · kv_heads · head_dim · context · 2 bytes
    int8 = 2 * (weights_per_layer + 2 * rows_per_layer)
    head8 = 100 * 128 + 2 * 100  # int8: the LM head quantized too, codes + a bf16 scale per vocabulary row
    assert quant.decode_bytes_per_token(cfg, "int8-wo", 10, batch=3) == int8 + head8 + rest + kv
    assert quant.decode_bytes_per_token(cfg, "fp8-wo", 10, batch=3) == int8 + head8 + rest + kv
    # int4: half a byte per weight in whole groups of 64 (a K = 128 row: 2 groups, 64 bytes; K = 200: 4 groups, 128
    # bytes, the last group padded), one bf16 scale per group
    codes4 = (128 + 2 * 64 + 128 + 2 * 200) * 64 + 128 * 128
    groups = 128 * 2 + 2 * 64 * 2 + 128 * 2 + 2 * 200 * 2 + 128 * 4
    head4 = 100 * 64 + 2 * 100 * 2
    assert quant.decode_bytes_per_token(cfg, "int4-wo", 10, batch=3) == 2 * (codes4 + 2 * groups) + head4 + rest + kv
    assert quant.decode_bytes_per_token(cfg, None, 10, batch=3) == metrics.decode_bytes(cfg, 3, 10, 2)
    want = metrics.decode_counts(cfg, 3, 9, 2, 2)
    got = quant.decode_counts(cfg, None, 3, 9, 2)
    assert (got.flops, got.bytes) == (want.flops, want.bytes)
    assert quant.decode_counts(cfg, "int4-wo", 3, 9, 2).bytes < quant.decode_counts(cfg, "int8-wo", 3, 9, 2).bytes


@pytest.mark.parametrize("scheme", ["int8-wo", "int4-wo"])
def test_a_quantized_llm_run_passes_its_gate_and_counts_the_bytes_it_moves(scheme: str) -> None:
    """The whole LLM run (engine.llm.run) of a quantized mode on CPU: gated by top-1 and KL over the gate's own
    GATE_STEPS decode steps (more than the 8 tokens unquantized modes compare), not the logits tolerance; its
    decode bytes are the packed weights' (fewer than the unquantized step's)."""
    from engine.llm.config import LLMConfig
    from engine.llm.run import llm_run

    cfg = LLMConfig(preset="tiny", prompt_len=8, new_tokens=quant.GATE_STEPS + 2, mode=scheme, prefill_iters=2,
                    decode_passes=1, profile=False, ceilings="none")
    result = llm_run(cfg)
    got = {(m.name, m.phase): m.value for m in result.metrics}
    assert got[("quant_top1_agreement", None)] >= quant.GATES[scheme].min_top1
    assert got[("quant_mean_kl_nats", None)] <= quant.GATES[scheme].max_kl
    assert any(n.startswith("accuracy gate: ") and n.endswith(f"over {quant.GATE_STEPS + 1} positions")
               for n in result.notes)
    assert (got[("quant_gate_min_top1", None)], got[("quant_gate_max_kl", None)]) == (
        quant.GATES[scheme].min_top1, quant.GATES[scheme].max_kl)
    assert got[("quantize_s", None)] >= 0 and any(f"quantized in {got[('quantize_s', None)]:.2f} s" in n
                                                  for n in result.notes)  # the same timing as the note's
    plain = llm_run(dataclasses.replace(cfg, mode="eager"))
    plain_bytes = {(m.name, m.phase): m.value for m in plain.metrics}[("bytes", "decode")]
    assert got[("bytes", "decode")] < plain_bytes
    assert got[("bytes_unquantized", "decode")] == plain_bytes  # "× fewer" divides by the step eager moved


def test_the_report_and_the_modes_table_show_the_gate_and_the_bytes(tmp_path) -> None:
    """A quantized run and eager's, stored as one group: report.md states the gate (not the logits tolerance) and the
    bytes per step; the page's and CLI's modes table puts bytes per token, the gain and the check beside TPOT."""
    from engine.llm.config import LLMConfig, params_of
    from engine.llm.report import from_store, llm_runs, modes_table, render
    from engine.llm.run import llm_run
    from engine.store.db import Store

    store = Store(tmp_path / "r.duckdb")
    store.init()
    ids = {}
    for mode in ("eager", "int8-wo"):
        cfg = LLMConfig(preset="tiny", prompt_len=8, new_tokens=quant.GATE_STEPS + 1, mode=mode, prefill_iters=1,
                        decode_passes=1, profile=False, ceilings="none")
        ids[mode] = store.create_run("llm", "llama-tiny", mode, "cpu", params_of(cfg), group_id="g")
        store.start_run(ids[mode])
        store.record_result(ids[mode], llm_run(cfg))

    report = render(from_store(store, ids["int8-wo"]))["report.md"]
    assert "accuracy gate: greedy top-1 agreement with the unquantized model" in report
    assert f"(≥ {quant.GATES['int8-wo'].min_top1:g})" in report and "Logits vs eager" not in report
    assert "| Bytes per decode step |" in report and "× fewer than unquantized" in report
    assert "Logits vs eager" in render(from_store(store, ids["eager"]))["report.md"]

    table = modes_table(llm_runs(store)).set_index("mode")
    assert list(table["weights"]) == ["int8-wo (plain)", "float32"]  # newest first
    fewer = float(table.loc["int8-wo", "vs unquantized"].removesuffix("× fewer"))
    assert 2.5 < fewer < 4.0  # fp32 weights (4 bytes) to int8 codes + scales, K/V and norms left in fp32
    assert table.loc["eager", "vs unquantized"] == "1×" and table.loc["eager", "accuracy"] == "the reference"
    assert table.loc["int8-wo", "accuracy"].startswith("top-1 ") and "(≤ " in table.loc["int8-wo", "accuracy"]
    assert table.loc["int8-wo", "bytes / token"].endswith("B") and table.loc["int8-wo", "vs plain"] == "—"
    assert table.loc["int8-wo", "quantized in"].endswith(" s") and table.loc["eager", "quantized in"] == "—"


def test_the_modes_table_sets_the_lab_gemv_beside_the_plain_way_of_its_scheme() -> None:
    import pandas as pd

    from engine.llm.report import modes_table

    rows = [  # headline columns as llm_runs gives them; one B=1 P=512 group and the same modes at B=4
        dict(id=3, mode="triton-int4-wo", batch=1, prompt_len=512, dtype="bfloat16", tpot_median_us=468.0,
             decode_bytes=7.6e8, decode_bytes_unquantized=2.5e9, quant_top1=0.72, quant_kl=3.9e-3,
             gate_min_top1=0.3, gate_max_kl=1.2e-2, mbu_pct=41.0, quantize_s=1.234, j_per_token=1.04),
        dict(id=2, mode="int4-wo", batch=1, prompt_len=512, dtype="bfloat16", tpot_median_us=3170.0,
             decode_bytes=7.6e8, quant_top1=0.72, quant_kl=3.9e-3, mbu_pct=6.1),
        dict(id=1, mode="triton-fused", batch=1, prompt_len=512, dtype="bfloat16", tpot_median_us=886.0,
             decode_bytes=2.5e9, prefill_rel_err=3e-3, decode_rel_err=4e-3, tolerance=5e-2, mbu_pct=80.0),
        dict(id=4, mode="triton-int4-wo", batch=4, prompt_len=512, dtype="bfloat16", tpot_median_us=900.0,
             decode_bytes=8e8),
    ]
    table = modes_table(pd.DataFrame(rows))
    first, plain, bf16, other = table.to_dict("records")
    assert first["vs plain"] == f"{3170 / 468:.2f}× faster than int4-wo" and first["vs unquantized"] == "3.29× fewer"
    assert first["accuracy"] == "top-1 0.72 (≥ 0.3), KL 0.0039 (≤ 0.012)" and first["weights"] == "int4-wo (lab GEMV)"
    assert first["quantized in"] == "1.23 s" and plain["quantized in"] == "—"
    assert first["J/token"] == "1.04 J" and plain["J/token"] == "—"  # energy where the device read it
    assert plain["vs unquantized"] == "3.29× fewer"  # not stored by this (older) run: the group's bf16 step's bytes
    assert plain["accuracy"] == "top-1 0.72, KL 0.0039" and plain["vs plain"] == "—"
    assert bf16["accuracy"] == "logits rel. error 0.004 (≤ 0.05)" and bf16["bytes / token"] == "2.50 GB"
    assert other["vs plain"] == "—" and other["vs unquantized"] == "—"  # no plain run, no bf16 run at B=4
    assert other["bytes / token"] == "200.00 MB" and other["accuracy"] == "accuracy gate: not recorded"


def test_the_triton_argmax_runs_after_the_compiled_forward_and_takes_its_tokens() -> None:
    """The lab's graph-decoded modes keep the Triton argmax out of Inductor (modes._next_token_kernel says why): the
    compiled forward's own token is a stand-in, pick_into_after's argmax takes the token from its logits straight
    into the decoder's buffer and moves the position (the decoder's own copy and add skipped: advances) — the same
    tokens as torch's argmax compiled with the step, the position one past the last."""
    from engine.kernels.triton.argmax import _chunk_kernel, argmax_rows_into
    from engine.llm.generate import pick_into_after

    if not _interpreted(_chunk_kernel):
        pytest.skip("the Triton kernels are compiled, not interpreted (TRITON_INTERPRET=1 unset)")
    model, prompt, ref = _tiny(seed=5, steps=4)
    forward = torch.compile(step_fn(model, modes._no_pick), dynamic=False, fullgraph=True)
    decoder = Decoder(pick_into_after(forward, argmax_rows_into), advances=True)
    with torch.no_grad():
        got = generate(step_fn(model), decoder, prompt, 4)
    assert torch.equal(got.tokens, ref.tokens)
    assert decoder.pos.tolist() == [prompt.shape[1] + 4]


def test_the_labs_triton_modes_take_the_next_token_with_the_triton_argmax_and_the_peers_with_torchs() -> None:
    """The lab's Triton modes take the next token with engine.kernels.triton.argmax (the same tokens as torch's
    argmax over the same prepared model, and the notes say so); the plain (peer) modes keep torch's."""
    from engine.kernels.triton.argmax import _chunk_kernel
    from engine.kernels.triton.quant_gemv import _wo_int4_kernel

    if not (_interpreted(_wo_int4_kernel) and _interpreted(_chunk_kernel)):
        pytest.skip("the Triton kernels are compiled, not interpreted (TRITON_INTERPRET=1 unset)")
    says = {}
    for name in ("triton-int4-wo", "int4-wo"):
        model, prompt, _ = _tiny(seed=4, steps=3)
        with torch.no_grad():
            prepared = modes.prepare(modes.get_mode(name), model, "cpu")
            got = generate(prepared.prefill, prepared.decoder, prompt, 3).tokens
            with_torchs = generate(step_fn(model), Decoder(step_fn(model)), prompt, 3).tokens
        assert torch.equal(got, with_torchs), name
        says[name] = any("Triton argmax" in n for n in prepared.notes)
    assert says == {"triton-int4-wo": True, "int4-wo": False}


def test_the_gate_fails_nan_or_inf_logits_saying_so() -> None:
    """A NaN KL compares False with the gate; the gate names the logits' NaN or inf instead of a KL of nan."""
    ref = [torch.tensor([[2.0, 1.0, 0.5, 0.0]])] * 2
    nan = [ref[0], torch.tensor([[float("nan"), 1.0, 0.5, 0.0]])]
    with pytest.raises(ToleranceError, match=r"int8-wo: logits contain NaN or inf \(1 NaN and 0 inf of 4 values\)"):
        quant.check_gate("int8-wo", ref, nan)
    with pytest.raises(ToleranceError, match="int8-wo: the reference's logits contain NaN or inf"):
        quant.check_gate("int8-wo", nan, ref)
    assert quant.check_gate("int8-wo", ref, ref).passed
