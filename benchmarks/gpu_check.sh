#!/usr/bin/env bash
# The GPU checks: one part per thing it checks, each reproducing the GPU figures in docs/figures.md.
#
#   benchmarks/gpu_check.sh PART [OUT]      (from the repository root, on a machine with a CUDA GPU)
#   benchmarks/gpu_check.sh list            the parts, one line each
#
# OUT (default $OUT, else /tmp/out) gets the logs and the store (gpu.duckdb). The machine's own python3 runs
# everything (on the GPU machine that is the one with a CUDA torch); duckdb and nvtx travel as wheels in .whl/ where
# it lacks them (see the device README). The `[N s, rc R]` lines give each step's wall time.
set -uo pipefail
part=${1:-list}; out=${2:-${OUT:-/tmp/out}}

parts() {
  cat <<'EOF'
env            what the machine has: GPU, driver, torch, Triton, nvcc
tests          the GPU suite (`make test-gpu`'s selection), its three slices spread over the machine's GPUs
ceilings       the device ceilings every "% of" divides by: copy bandwidth, matmul rates, launch costs
mlp            house-price MLP in eager, cuda-graph, triton, cuda: per-call and loop (back-to-back) medians
bench-all      `bench --mode all --device cuda` twice (cold, then warm): each run's seconds
aoti           the aoti mode cold then warm, its phase timeline, then aoti_timing.py (where a load's time goes)
gemv           GEMV tests, cuBLAS vs Triton per weight shape (gemv_bench.py), 1B/7B compile-cudagraph vs triton-gemv
decode         decode-attention and GEMV tests, the sm_90 compile check, 1B and 7B in triton-gemv/-decode/-fused
argmax         the next token's argmax alone (argmax_bench.py): torch's, eager and compiled, beside the Triton one
decode-path    1B triton-fused and triton-int4-wo profiled: each decode kernel's time on the critical path per step
llm-1b-all     1B, every LLM mode, prepared side by side and timed alone: total seconds and each run's phase timeline
llm-7b-all     7B, every LLM mode (DEVICE_MEMORY=80GB: held to that much): wall seconds, each run's status and
               J/token, the phase timelines (each phase's peak memory in the store, gpu.duckdb); runs on past a
               call (WAIT_S, default 570): call the part again to go on waiting
levels         every kernel level of the three components at their real shapes
cuda-levels    the L5 CUDA kernels: build (ptxas registers), checks, timings against torch (cuda_levels_gpu.py)
triton-levels  the L4 Triton kernels: checks and timings against torch (benchmarks/triton_kernels_gpu.py)
host-cost      host time per call of the Triton levels and its cProfile (benchmarks/triton_host_cost.py)
quant          weight-only quantized decode: 1B and 7B, bf16 triton-fused beside every quantized mode, its modes table;
               then the prefill's dequantization per tile (prefill_dequant_bench.py; QUANT_PREFILL=0 leaves it out)
frontier       the targets: L5 attention variants vs SDPA (unverified ones in a child first), attention levels (FRONTIER_DEEP=1:
               with ncu per kernel), 1B/7B MBU (FRONTIER_PRESETS)
envelope-kernels decode's kernels across batch and context: the int4 rows kernel against dequantize+cuBLAS
               (quant_rows_bench.py, 7B and 1B), the split-K bf16 rows kernel against cuBLAS (rows_gemm_bench.py), the decode attention's tiles and split counts at long contexts
               (decode_attention_bench.py --long, decode_envelope.py's attention table)
envelope       the decode envelope: `llm --sweep batch=… --sweep prompt=…` for ENV_PRESET (7B) in ENV_MODES
               (compile-cudagraph,triton-fused) over ENV_BATCH × ENV_PROMPT (1,8,32 × 512,8192), then its envelope
               table; runs on past a call like llm-7b-all (WAIT_S): call the part again to go on waiting
gluon-l4       the L4 attention's Gluon kernel: checked against float64 in a child process, then, if it passed, timed
               beside SDPA and the tl kernel, and the causal-attention L4 level (its per-shape choice between the two
               kernels in the runs' notes)
EOF
}
[ "$part" = list ] && { parts; exit 0; }
parts | grep -q "^$part " || { echo "unknown part '$part'; the parts:"; parts; exit 2; }

mkdir -p "$out"
if ! python3 -c "import duckdb" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export RESULTS_DB="$out/gpu.duckdb" ARTIFACTS_DIR=${ARTIFACTS_DIR:-/tmp/art}
export MODELAB_BUILD_DIR=${MODELAB_BUILD_DIR:-/tmp/mb}
export PYTHONUNBUFFERED=1
t() { local s=$SECONDS; "$@"; local rc=$?; echo "[$((SECONDS - s)) s, rc $rc] $*"; return $rc; }
# functions, so `timeout` cannot run them: PYTEST_LIMIT / LLM_LIMIT bound them instead
pytest_q() { timeout "${PYTEST_LIMIT:-1800}" python3 -m pytest -q -x -p no:cacheprovider "$@" 2>&1 | tail -3; }
llm() { timeout "${LLM_LIMIT:-1800}" python3 -m engine llm --prompt-len 512 --new-tokens 128 --device cuda "$@"; }
# `in_session HOME LOG CMD…`: CMD in a process session of its own (setsid), its output in HOME/LOG and its exit
# status in HOME/rc, so it can outlive one call; started unless it already ran or runs there. Waits for it up to
# WAIT_S seconds (default 570); true once it has ended. Called again while it runs (the machine still warm), it goes
# on waiting.
in_session() {
  local home=$1 log=$2; shift 2
  mkdir -p "$home"
  if [ ! -e "$home/rc" ] && ! { [ -s "$home/pid" ] && kill -0 "$(cat "$home/pid")" 2>/dev/null; }; then
    setsid bash -c 'home=$0 log=$1; shift; "$@" >"$home/$log" 2>&1; echo $? >"$home/rc"' "$home" "$log" "$@" \
      </dev/null &
    echo $! >"$home/pid"
    echo "started: pid $(cat "$home/pid"), its output $home/$log"
  fi
  local deadline=$((SECONDS + ${WAIT_S:-570}))
  while [ ! -e "$home/rc" ] && [ $SECONDS -lt $deadline ]; do sleep 2; done
  [ -e "$home/rc" ] || { echo "still running after ${WAIT_S:-570} s: call this part again within the machine's idle \
time"; tail -5 "$home/$log"; return 1; }
}
seconds_per_run() {
  python3 -m engine sql "SELECT id, mode, status, round(epoch(finished_at) - epoch(started_at), 1) AS s FROM runs
    WHERE kind = '$1' ORDER BY id"
}

case $part in
  env) nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
       python3 -c "import torch, triton; print('torch', torch.__version__, '· Triton', triton.__version__, '·',
         torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
       nvcc --version 2>/dev/null | tail -1 ;;
  tests) # the Makefile's three slices (and its selection), one per GPU at once where the machine has several; each
         # GPU's slices get their own build dir, device-lock dir and store; SUITE_LIMIT bounds each slice (SIGINT:
         # pytest still prints what ran); SLICES picks some (e.g. "kernels levels" on two GPUs in one 10-minute
         # call, then "rest": on two H200s kernels and levels each take ~8 minutes, the rest ~7; NAME=A,B runs
         # pytest on A B (commas for spaces). SLICES=four: four slices of 5-8 minutes each, one per GPU of an
         # nvidia-h200-x4 in one 10-minute call (the levels without their two slowest files, the rest, the CUDA
         # kernels with those two files, the other kernel files). On two GPUs: SLICES=four-1, then SLICES=four-2 in
         # a second call; there the other kernel files' slice can run past a 10-minute call. Each slice's log lists
         # every test of 2 s or more, to rebalance the four by.
         gpus=$(nvidia-smi -L | wc -l); [ "$gpus" -ge 1 ] || gpus=1
         sel=${GPU_MARKS:-$(sed -n 's/^GPU_MARKS ?= //p' Makefile)}  # the marker expression of make test-gpu
         slices=()
         k=tests/engine/kernels lv=tests/engine/levels
         four="lv=$lv,--ignore=$lv/test_yours.py,--ignore=$lv/test_user_triton_kernel.py rest
               kc=$k/test_cuda_levels.py,$k/test_cuda_quant.py,$lv/test_yours.py,$lv/test_user_triton_kernel.py
               kt=$k,--ignore=$k/test_cuda_levels.py,--ignore=$k/test_cuda_quant.py"
         read -r -a four_ <<<"$(echo $four)"
         case ${SLICES:-} in  # four-1, four-2: its first two, its last two (two GPUs: one 10-minute call each)
           four) SLICES=$four ;;
           four-1) SLICES="${four_[0]} ${four_[1]}" ;;
           four-2) SLICES="${four_[2]} ${four_[3]}" ;;
         esac
         for name in ${SLICES:-kernels levels rest}; do
           case $name in
             kernels|levels) slices+=("$name:tests/engine/$name") ;;
             rest) slices+=("rest:tests/engine --ignore=tests/engine/kernels --ignore=tests/engine/levels") ;;
             *=*) slices+=("${name%%=*}:${name#*=}") ;;  # NAME=PATH,PATH…: a slice of one's own
             *) echo "unknown slice '$name' (kernels, levels, rest, or NAME=PATH,PATH…)"; exit 2 ;;
           esac
         done
         for g in $(seq 0 $((gpus - 1))); do
           ( for i in "${!slices[@]}"; do
               [ $((i % gpus)) -eq "$g" ] || continue
               name=${slices[$i]%%:*}; paths=${slices[$i]#*:}; paths=${paths//,/ }
               # shellcheck disable=SC2086 - the slice's paths and --ignore options split on purpose
               CUDA_VISIBLE_DEVICES=$g MODELAB_BUILD_DIR=/tmp/mb$g MODELAB_LOCK_DIR=/tmp/lock$g RESULTS_DB="$out/tests$g.duckdb" \
                 timeout -s INT "${SUITE_LIMIT:-3000}" python3 -m pytest -q -rfE -p no:cacheprovider --durations=0 --durations-min=2 \
                 $paths -m "$sel" >"$out/tests_$name.log" 2>&1
               echo "rc $?" >>"$out/tests_$name.log"
             done ) &
         done
         wait
         for s_ in "${slices[@]}"; do
           echo "== ${s_%%:*}"; grep -E "passed|failed|FAILED|ERROR|^rc " "$out/tests_${s_%%:*}.log" | tail -8
         done ;;
  ceilings) t python3 -m engine ceilings --device cuda ;;
  mlp) t python3 -m engine ceilings --device cuda >"$out/ceilings.log" 2>&1
       t python3 -m engine bench --mode eager,cuda-graph,triton,cuda --device cuda --iters 200 >"$out/mlp.log" 2>&1
       python3 -m engine sql "SELECT r.mode, m.phase, m.batch_size,
         round(max(CASE WHEN m.name = 'median' THEN m.value END), 1) AS median_us,
         round(max(CASE WHEN m.name = 'loop_median' THEN m.value END), 1) AS loop_us
         FROM runs r JOIN metrics m ON m.run_id = r.id WHERE r.kind = 'bench' AND r.status = 'ok'
         GROUP BY r.id, r.mode, m.phase, m.batch_size ORDER BY m.phase, m.batch_size, median_us" ;;
  bench-all) t timeout 580 python3 -m engine bench --mode all --device cuda >"$out/bench_cold.log" 2>&1
             t timeout 200 python3 -m engine bench --mode all --device cuda >"$out/bench_warm.log" 2>&1
             tail -3 "$out/bench_cold.log" "$out/bench_warm.log"
             seconds_per_run bench ;;
  aoti) for pass in cold warm; do
          t python3 -m engine bench --mode aoti --device cuda >"$out/aoti_$pass.log" 2>&1; tail -3 "$out/aoti_$pass.log"
        done
        python3 benchmarks/run_timelines.py --kind bench
        t python3 benchmarks/aoti_timing.py --device cuda ;;
  gemv) t python3 -m engine ceilings --device cuda >"$out/ceilings.log" 2>&1
        t pytest_q tests/engine/kernels/test_gemv.py
        t python3 benchmarks/gemv_bench.py --preset 1B,7B >"$out/gemv.log" 2>&1; cat "$out/gemv.log"
        t llm --preset 1B --mode compile-cudagraph,triton-gemv >"$out/llm1b_gemv.log" 2>&1
        t llm --preset 7B --mode compile-cudagraph,triton-gemv --no-profile >"$out/llm7b_gemv.log" 2>&1
        tail -12 "$out/llm1b_gemv.log"; tail -12 "$out/llm7b_gemv.log" ;;
  decode) t pytest_q tests/engine/kernels/test_decode_attention.py tests/engine/kernels/test_gemv.py
          t python3 benchmarks/triton_aot_check.py --arch 90 | tail -3
          for preset in 1B 7B; do
            t llm --preset $preset --mode ${DECODE_MODES:-triton-gemv,triton-decode,triton-fused} \
              >"$out/llm${preset}_decode.log" 2>&1
            tail -8 "$out/llm${preset}_decode.log"
          done ;;
  argmax) t python3 benchmarks/argmax_bench.py >"$out/argmax_bench.log" 2>&1; tail -8 "$out/argmax_bench.log" ;;
  decode-path) LLM_LIMIT=300 t llm --preset 1B --mode triton-fused,triton-int4-wo >"$out/decode_path.log" 2>&1
               grep -E "^ +[0-9]+ triton" "$out/decode_path.log"
               # op_stats' device self time: what each kernel adds after the one before it ends (under PDL a
               # kernel's whole duration also counts its wait for the one before: total_us)
               python3 -m engine sql "SELECT r.mode, substr(o.name, 1, 48) AS kernel, o.calls / s.value AS per_step,
                 round(o.self_us / s.value, 1) AS critical_us_per_step, round(o.total_us / o.calls, 2) AS duration_us
                 FROM op_stats o JOIN runs r ON r.id = o.run_id
                 JOIN metrics s ON s.run_id = r.id AND s.name = 'prof_steps' AND s.phase = 'decode'
                 WHERE o.device = 'cuda' AND o.phase = 'decode' AND r.kind = 'llm' ORDER BY r.id, o.self_us DESC" ;;
  llm-1b-all) t timeout 580 python3 -m engine llm --preset 1B --prompt-len 512 --new-tokens 128 --mode all \
                --device cuda >"$out/llm1b_all.log" 2>&1; tail -30 "$out/llm1b_all.log"
              python3 benchmarks/run_timelines.py --kind llm ;;
  llm-7b-all) # in a process session of its own (in_session), so it can outlive one call. Both variants (all the
              # device's memory, DEVICE_MEMORY) keep one store, /tmp/llm7b-all's, so the second plans with the peaks
              # the first measured; it is copied to OUT with the variant's log.
              store=/tmp/llm7b-all
              if in_session "$store/${DEVICE_MEMORY:-whole}" llm7b_all.log env RESULTS_DB="$store/gpu.duckdb" \
                  python3 -m engine llm --preset 7B --prompt-len 512 --new-tokens 128 --mode all --device cuda \
                  ${DEVICE_MEMORY:+--device-memory "$DEVICE_MEMORY"}; then
                home=$store/${DEVICE_MEMORY:-whole}
                cp "$home/llm7b_all.log" "$out/"
                [ -e "$store/gpu.duckdb" ] && cp "$store/gpu.duckdb" "$out/"
                echo "[rc $(cat "$home/rc")] the group ended; the runs' own times are in the store"
                tail -40 "$out/llm7b_all.log"
                RESULTS_DB="$out/gpu.duckdb" python3 benchmarks/run_timelines.py --kind llm
              fi ;;
  levels) t python3 -m engine levels --component "${LEVEL_COMPONENTS:-all}" --level all --device cuda \
            >"$out/levels.log" 2>&1
          tail -40 "$out/levels.log" ;;
  cuda-levels) t timeout 500 python3 benchmarks/cuda_levels_gpu.py --out "$out/cl" >"$out/cuda_levels.log" 2>&1
               grep -E "registers|spill" "$out/cuda_levels.log" | head -20; tail -25 "$out/cuda_levels.log" ;;
  triton-levels) t timeout 500 python3 benchmarks/triton_kernels_gpu.py >"$out/triton_levels.log" 2>&1
                 tail -20 "$out/triton_levels.log" ;;
  host-cost) t python3 benchmarks/triton_host_cost.py >"$out/host_cost.log" 2>&1; tail -70 "$out/host_cost.log" ;;
  quant) for preset in ${QUANT_PRESETS:-1B 7B}; do  # the run prints each mode's bytes/token, gain and gate
           t timeout 560 python3 -m engine llm --preset $preset --prompt-len 512 --new-tokens 128 --device cuda \
             --no-profile --mode ${QUANT_MODES:-triton-fused,triton-int8-wo,triton-fp8-wo,triton-int4-wo,int8-wo} \
             >"$out/quant_$preset.log" 2>&1
           echo "== $preset"; tail -12 "$out/quant_$preset.log"
         done
         if [ "${QUANT_PREFILL:-1}" != 0 ]; then
           t timeout 300 python3 benchmarks/prefill_dequant_bench.py --preset "$(echo ${QUANT_PRESETS:-1B 7B} | tr ' ' ,)" \
             >"$out/prefill_dequant.log" 2>&1
           tail -5 "$out/prefill_dequant.log"
         fi ;;
  envelope-kernels)
         for preset in ${ROWS_PRESETS:-7B 1B}; do
           t timeout 200 python3 benchmarks/quant_rows_bench.py --preset $preset --batch ${ROWS_BATCH:-2,4,8,16} \
             >"$out/quant_rows_$preset.log" 2>&1; tail -12 "$out/quant_rows_$preset.log"
           t timeout 200 python3 benchmarks/rows_gemm_bench.py --preset $preset --batch 2,8,16,32 \
             >"$out/rows_gemm_$preset.log" 2>&1; tail -6 "$out/rows_gemm_$preset.log"
         done
         t timeout 200 python3 benchmarks/decode_attention_bench.py --long --preset ${ATTN_PRESETS:-7B,1B} \
           --batch ${ATTN_BATCH:-1,8} --context ${ATTN_CONTEXT:-8320} --top 6 >"$out/attention_long.log" 2>&1
         cat "$out/attention_long.log"
         for preset in $(echo ${ATTN_PRESETS:-7B,1B} | tr , ' '); do
           t timeout 150 python3 benchmarks/decode_envelope.py --preset $preset --batch ${ATTN_BATCH:-1,8} \
             --prompt 512,8192 --skip products >"$out/envelope_attention_$preset.log" 2>&1
           tail -6 "$out/envelope_attention_$preset.log"
         done ;;
  envelope) # in a process session of its own (in_session), one folder per preset; the store copied to OUT at the end
            home=/tmp/envelope/${ENV_PRESET:-7B}
            if in_session "$home" envelope.log env RESULTS_DB="$home/gpu.duckdb" python3 -m engine llm \
                --preset "${ENV_PRESET:-7B}" --new-tokens 128 --device cuda --no-profile \
                --mode "${ENV_MODES:-compile-cudagraph,triton-fused}" --sweep batch="${ENV_BATCH:-1,8,32}" \
                --sweep prompt="${ENV_PROMPT:-512,8192}"; then
              cp "$home/envelope.log" "$out/envelope_${ENV_PRESET:-7B}.log"
              cp "$home/gpu.duckdb" "$out/envelope_${ENV_PRESET:-7B}.duckdb"
              echo "[rc $(cat "$home/rc")] the sweep ended"; grep -v "^\s*$" "$home/envelope.log" | tail -45
            fi ;;
  gluon-l4) if PYTEST_LIMIT=320 t pytest_q tests/engine/kernels/test_triton_kernels.py -k "gluon or l4_"; then
              t timeout 200 python3 benchmarks/triton_kernels_gpu.py --only attn --gluon >"$out/gluon_attn.log" 2>&1
              grep -E "gluon|SDPA" "$out/gluon_attn.log" | tail -16
              t timeout 280 python3 -m engine levels --component causal_attention \
                --level L1-native,L4-triton --device cuda >"$out/gluon_l4.log" 2>&1
              tail -${FRONTIER_TAIL:-12} "$out/gluon_l4.log"
              python3 -m engine sql "SELECT id, notes FROM runs WHERE notes LIKE '%L4 attention for%'"
            fi ;;
  frontier) t timeout 300 python3 benchmarks/cuda_levels_gpu.py --only small,attn --out "$out/cl" \
              >"$out/frontier_l5.log" 2>&1; tail -25 "$out/frontier_l5.log"
            t timeout 280 python3 -m engine levels --component causal_attention --level L1-native,L4-triton,L5-cuda \
              --device cuda ${FRONTIER_DEEP:+--deep} >"$out/frontier_levels.log" 2>&1
            tail -${FRONTIER_TAIL:-12} "$out/frontier_levels.log"
            for preset in ${FRONTIER_PRESETS-1B 7B}; do
              t timeout 200 python3 -m engine llm --preset $preset --prompt-len 512 --new-tokens 128 --device cuda \
                --no-profile --mode triton-fused >"$out/frontier_$preset.log" 2>&1
              tail -4 "$out/frontier_$preset.log" | head -2
            done ;;
esac
