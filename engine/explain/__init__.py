"""Explain: why one mode's step is slower than another's, decomposed from the runs the store holds (why), and
`python -m engine explain` (engine/cli/explain.py)."""
