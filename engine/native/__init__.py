"""Native code for Mode Lab: building csrc/ against the installed torch (build, with the compiler chosen by
toolchain), background builds a group needs (prebuild), the Python side of the custom operators (ops), the cuda
mode's extension (mlp_step), and the AOTInductor package helpers, native runner driver and option probe (aoti,
aoti_probe)."""
