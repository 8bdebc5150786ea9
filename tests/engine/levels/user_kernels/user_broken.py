"""A user module that fails at import time."""

raise ImportError("libmykernel.so: cannot open shared object file")
