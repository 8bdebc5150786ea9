"""Compare: did it get slower? Two sets of runs compared series by series with a statistical gate (verdict), change
points in a series' history (changepoints). `python -m engine compare` is engine/cli/compare.py."""
