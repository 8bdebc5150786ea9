#!/usr/bin/env bash
# One device-machine call: the GPU-only tests of the newer parts, then the figures the issues ask for.
# Usage (from the repository root, on the GPU machine): scripts/gpu_check.sh PART [OUT]
#   PART = tests | mlp | llm7b | bench-all | bench-cold | bench-warm | llm1b-all | llm-gemv | llm7b-gemv | decode | aoti-timeline | bench-both | host-cost | fused | wgmma | pdl | s6 | s6b |
#          next (what the third session could not run: triton-decode, level graph times, aoti's timeline)        OUT (default $OUT or /tmp/out): logs and the store
# Carries duckdb/nvtx as wheels in .whl/ when the machine lacks them (see the device README).
set -uo pipefail
part=${1:?part}; out=${2:-${OUT:-/tmp/out}}; mkdir -p "$out"
if ! python3 -c "import duckdb" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export RESULTS_DB="$out/gpu.duckdb" ARTIFACTS_DIR=/tmp/art MODELAB_BUILD_DIR=${MODELAB_BUILD_DIR:-/tmp/mb}
t() { local s=$SECONDS; "$@"; local rc=$?; echo "[$((SECONDS - s)) s, rc $rc] $*"; return $rc; }
case $part in
  tests) t python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_mlp_modes.py tests/engine/kernels/test_cuda_levels.py \
           tests/engine/test_timing.py tests/engine/test_explain.py -k "cuda or loop or blocks or explain" 2>&1 | tail -15 ;;
  mlp) t python3 -m engine ceilings --device cuda >"$out/ceilings.log" 2>&1
       t python3 -m engine bench --mode eager,cuda-graph,triton,cuda --device cuda --iters 200 >"$out/mlp.log" 2>&1
       python3 -m engine sql "SELECT r.mode, m.phase, m.batch_size, round(max(CASE WHEN m.name='median' THEN m.value END),1) AS median_us,
         round(max(CASE WHEN m.name='loop_median' THEN m.value END),1) AS loop_us FROM runs r JOIN metrics m ON m.run_id=r.id
         WHERE r.kind='bench' AND r.status='ok' GROUP BY r.id, r.mode, m.phase, m.batch_size ORDER BY m.phase, m.batch_size, median_us" ;;
  llm7b) t python3 -m engine llm --preset 7B --prompt-len 512 --new-tokens 128 --mode compile-cudagraph --device cuda \
           --no-profile >"$out/llm7b.log" 2>&1; tail -25 "$out/llm7b.log" ;;
  bench-all) t timeout 370 python3 -m engine bench --mode all --device cuda >"$out/bench_cold.log" 2>&1
             t timeout 150 python3 -m engine bench --mode all --device cuda >"$out/bench_warm.log" 2>&1
             tail -5 "$out/bench_cold.log" "$out/bench_warm.log" ;;
  bench-cold) t timeout 580 python3 -m engine bench --mode all --device cuda >"$out/bench_cold.log" 2>&1
              tail -16 "$out/bench_cold.log" ;;
  bench-warm) t timeout 200 python3 -m engine bench --mode all --device cuda >"$out/bench_warm.log" 2>&1
              tail -3 "$out/bench_warm.log"
              python3 -m engine sql "SELECT id, mode, status, round(epoch(finished_at) - epoch(started_at), 1) AS s FROM runs
                WHERE kind = 'bench' ORDER BY id" ;;
  llm7b-gemv) t python3 -m engine llm --preset 7B --prompt-len 512 --new-tokens 128 --mode triton-gemv --device cuda \
                --no-profile >"$out/llm7b_gemv.log" 2>&1; tail -4 "$out/llm7b_gemv.log" ;;
  llm-gemv) t python3 -m engine ceilings --device cuda >"$out/ceilings.log" 2>&1
            t python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_gemv.py 2>&1 | tail -3
            t python3 scripts/gemv_bench.py --preset 1B,7B >"$out/gemv.log" 2>&1
            t python3 -m engine llm --preset 1B --prompt-len 512 --new-tokens 128 --mode compile-cudagraph,triton-gemv \
              --device cuda >"$out/llm1b.log" 2>&1
            t python3 -m engine llm --preset 7B --prompt-len 512 --new-tokens 128 --mode compile-cudagraph,triton-gemv \
              --device cuda --no-profile >"$out/llm7b.log" 2>&1
            tail -12 "$out/llm1b.log"; tail -12 "$out/llm7b.log"; cat "$out/gemv.log" ;;
  next) t python3 scripts/triton_aot_check.py | tail -3
        t python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_decode_attention.py 2>&1 | tail -2
        t python3 -m engine llm --preset 7B --prompt-len 512 --new-tokens 128 --mode triton-gemv,triton-decode \
          --device cuda --no-profile >"$out/llm7b_decode.log" 2>&1; tail -5 "$out/llm7b_decode.log"
        t python3 -m engine levels --component vit_patch_attention,causal_attention --level all --device cuda \
          >"$out/levels.log" 2>&1; tail -25 "$out/levels.log"
        t python3 -m engine bench --mode aoti --device cuda >"$out/aoti.log" 2>&1
        cat /tmp/art/run_*/progress.jsonl 2>/dev/null | tail -30 ;;
  decode) t python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_decode_attention.py 2>&1 | tail -2
          t python3 -m engine llm --preset 7B --prompt-len 512 --new-tokens 128 --mode triton-gemv,triton-decode \
            --device cuda --no-profile >"$out/llm7b_decode.log" 2>&1; tail -6 "$out/llm7b_decode.log" ;;
  aoti-timeline) for pass in cold warm; do
            t python3 -m engine bench --mode aoti --device cuda >"$out/aoti_$pass.log" 2>&1; tail -3 "$out/aoti_$pass.log"; done
          python3 scripts/run_timelines.py --kind bench ;;
  bench-both) t timeout 440 python3 -m engine bench --mode all --device cuda >"$out/bench_cold.log" 2>&1
              t timeout 140 python3 -m engine bench --mode all --device cuda >"$out/bench_warm.log" 2>&1
              python3 -m engine sql "SELECT id, mode, status, round(epoch(finished_at) - epoch(started_at), 1) AS s FROM runs
                WHERE kind = 'bench' ORDER BY id" ;;
  fused) t python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_gemv.py 2>&1 | tail -2
         for preset in 7B 1B; do
           t python3 -m engine llm --preset $preset --prompt-len 512 --new-tokens 128 --device cuda --no-profile \
             --mode ${FUSED_MODES:-triton-gemv,triton-decode,triton-fused} >"$out/llm${preset}_fused.log" 2>&1
           tail -6 "$out/llm${preset}_fused.log"
         done ;;
  wgmma) t python3 -c "from engine.kernels import cuda_levels as c; c.load(verbose=True)" >"$out/build.log" 2>&1
         grep -A2 "attention_wgmma" "$out/build.log" | grep -E "registers|spill" | head -8
         t python3 scripts/attention_variant_probe.py --variants 6,5,4
         t timeout 300 python3 scripts/cuda_levels_gpu.py --only small,attn --out "$out/cl" >"$out/cl.log" 2>&1
         grep -E "attention_wgmma|FAIL" "$out/cl.log" | head -20; tail -22 "$out/cl.log"
         t python3 -m engine levels --component causal_attention --level L1-native,L4-triton,L5-cuda --device cuda \
           >"$out/levels.log" 2>&1; tail -12 "$out/levels.log" ;;
  host-cost) t python3 scripts/triton_host_cost.py >"$out/host_cost.log" 2>&1; tail -70 "$out/host_cost.log" ;;
  llm1b-all) t timeout 400 python3 -m engine llm --preset 1B --prompt-len 512 --new-tokens 128 --mode all --device cuda \
               >"$out/llm1b_all.log" 2>&1; tail -30 "$out/llm1b_all.log"
             for f in /tmp/art/run_*/progress.jsonl; do d=${f%/progress.jsonl}; cp "$f" "$out/progress_${d##*/}.jsonl"; done
             python3 scripts/run_timelines.py --kind llm ;;
  pdl) t timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_gemv.py \
          tests/engine/kernels/test_decode_attention.py 2>&1 | tail -3
       for preset in ${PDL_PRESETS:-1B 7B}; do for pdl in 0 1; do
         MODELAB_TRITON_PDL=$pdl t python3 -m engine llm --preset $preset --prompt-len 512 --new-tokens 128 \
           --device cuda --no-profile --mode triton-fused >"$out/llm${preset}_pdl$pdl.log" 2>&1
         echo "$preset PDL=$pdl"; tail -4 "$out/llm${preset}_pdl$pdl.log" | head -2
       done; done ;;
  s6) t timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_decode_attention.py \
         tests/engine/kernels/test_gemv.py -k "qkv or fused or deferred or matches or swiglu" 2>&1 | tail -2
      bash scripts/gpu_check.sh llm1b-all "$out" | grep -E "^ +[0-9]+ |rc " 
      for preset in 7B 1B; do
        t python3 -m engine llm --preset $preset --prompt-len 512 --new-tokens 128 --device cuda --mode triton-fused \
          >"$out/llm${preset}_fused.log" 2>&1; tail -4 "$out/llm${preset}_fused.log" | head -2; done ;;
  s6b) t timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/engine/kernels/test_decode_attention.py 2>&1 | tail -2
       for preset in 1B 7B; do
         t python3 -m engine llm --preset $preset --prompt-len 512 --new-tokens 128 --device cuda --mode triton-fused \
           >"$out/llm${preset}_fused.log" 2>&1; tail -4 "$out/llm${preset}_fused.log" | head -2; done ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
