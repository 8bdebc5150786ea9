"""The LLM lab: prefill and decode of the Llama-style decoder (engine/workloads/llama.py) per execution mode —
TTFT, TPOT, MFU, MBU, operator breakdowns and reports. Entry points: `python -m engine llm`, the job target
`engine.llm.run:llm_job`, the LLM page."""
