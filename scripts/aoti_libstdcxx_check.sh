#!/usr/bin/env bash
# Does a libstdc++ mismatch explain the AOTInductor load crash on the GPU image? (see csrc/README.md, "AOTInductor")
# Builds one CPU .pt2 (fast), then loads it in fresh processes: plain, and with the compiler's own libstdc++ preloaded.
set -u
CXX=${CXX:-g++}
echo "compiler: $($CXX --version | head -1)"
echo "compiler's libstdc++: $($CXX -print-file-name=libstdc++.so.6)"
python3 - <<'PY'
import torch, re
print("torch", torch.__version__, "built with", torch.__config__.show().split("\n")[1].strip())
maps = open("/proc/self/maps").read()
print("libstdc++ in a python+torch process:", sorted(set(re.findall(r"\S*libstdc\+\+\S*", maps))))
PY
pkg=$(python3 -c "
from engine.native import aoti; from engine.workloads import get_workload
w = get_workload('house_price'); m = w.make_model().eval(); (x,), _ = w.make_batch(64, 'cpu')
print(aoti.compile_package(m, (x,), use_cache=False).path)" 2>/dev/null | tail -1)
echo "package: $pkg"
load='import sys, torch; f = torch._inductor.aoti_load_package(sys.argv[1]); print("loaded and ran:", tuple(f(torch.randn(64, 5)).shape))'
python3 -c "$load" "$pkg" 2>&1 | tail -1; echo "plain load: exit ${PIPESTATUS[0]}"
LD_PRELOAD=$($CXX -print-file-name=libstdc++.so.6) python3 -c "$load" "$pkg" 2>&1 | tail -1; echo "with LD_PRELOAD=compiler libstdc++: exit ${PIPESTATUS[0]}"
