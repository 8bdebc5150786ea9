"""The LLM lab: prefill and decode of the Llama-style decoder (engine/workloads/llama.py) per execution mode —
TTFT, TPOT, MFU, MBU, operator breakdowns and reports.

run (one run: reference, prepare, check, time, profile), modes (the execution modes and how each prepares its step),
generate (greedy generation with the static KV cache), timed (its timers), config and group (what a run is, how a group
of runs shares a device), metrics and report (counts, MBU/MFU, the modes table and report files), verify (checks against
the reference), quant (weight-only quantized decode and its gate), hf and hf_route (your own checkpoints, native or
through transformers), prompts, tp, tp_launch and tp_rank (tensor parallel). Entry points: `python -m engine llm`, the
job target `engine.llm.run:llm_job`, the LLM page."""
