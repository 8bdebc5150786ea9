"""The command line, `python -m engine <command> --help` (main): every feature headless, on the same store and
runner as the dashboard."""
