"""Native code for Mode Lab: building csrc/ against the installed torch (build.py), the Python side of the custom
operators (ops.py), and the AOTInductor package helpers and native runner driver (aoti.py)."""
