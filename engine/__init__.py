"""Mode Lab engine: a pure library (no streamlit) that checks, times and stores PyTorch execution modes.

By layer, lowest first; a package imports only the layers below it (tests/engine/test_import_graph.py):

- store/: the DuckDB file — runs, metrics, samples, artifacts, schema and migrations, the environment of each run.
- runner/: runs in worker processes (queue, fork server, supervisor), the device lock, the order a group runs in.
- measure/: timers, checks against a reference, cache state, the device's measured ceilings, profiler reductions.
- workloads/: what a run measures — the house-price MLP, your own model, the Llama-style decoder, Kernel Levels'
  components, the IR explorer's model zoo.
- modes/: the execution modes bench checks and times (eager, fx, torchscript, compile, cuda-graph, triton, cuda,
  custom_op, aoti).
- kernels/: hand-written kernels — Triton (Kernel Levels L4, the LLM decode step) and the CUDA wrappers (L5, int4).
- native/: building csrc/ against the installed torch, custom ops, AOTInductor packages and the native runner.
- bench/: a workload's modes checked against eager, then timed (`bench`).
- housing/: the house-price lab — train a model in any mode, price a house with it.
- profiling/: torch.profiler traces, operator tables and Nsight Compute per run (`profile`).
- ir/: a model's graph on the meta device as JSON, with an executor and a verifier (`ir`).
- levels/: one component written five ways, L1 naive to L5 CUDA, with guards for your own kernel (`levels`).
- llm/: prefill and decode of the decoder per mode, quantized decode, tensor parallel (`llm`).
- compare/: two sets of runs compared with a statistical gate, change points in a history (`compare`).
- explain/: why one mode's step is slower than another's (`explain`).
- cli/: `python -m engine <command>`, every feature headless; app/ (the dashboard) sits above it.
"""

__version__ = "0.1.0"
