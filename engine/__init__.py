"""Mode Lab engine: a pure library (no streamlit) for training, benchmarking and storing PyTorch execution modes.

Concepts, one module each: data (dataset), workloads (model + inputs + loss), modes (execution modes), timing,
bench (check against eager + time), train, predict, store (DuckDB), jobs + worker (process isolation), envinfo.
"""

__version__ = "0.1.0"
