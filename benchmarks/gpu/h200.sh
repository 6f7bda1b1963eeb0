#!/usr/bin/env bash
# h200.sh: this project on a borrowed CUDA host (the H200 of the device tool; not a GB10), with
# vLLM's CUDA build carried in as ../shared/gpu/bundle.sh packs it (5 parts; one device call
# carries at most 64 MiB with the tracked tree, so one part travels per call and waits in /tmp
# for the next).
#
#   PART_MB=55 ../shared/gpu/bundle.sh .gl/bundle     here: p.0 .. p.4 in the ignored .gl/
#   h200.sh stash N          on the host, one call per part (carry .gl/bundle/p.N; BUNDLE_DIR
#                            names another folder of parts, e.g. .gl/bundle34 for a trial
#                            release, and SPARKGPU_ROOT another install folder, so that two
#                            releases can be installed on one machine)
#   h200.sh tests            on the host: the lm-head's tests, the GPU ones included (carry
#                            .gl/pytest too: pip download pytest pluggy iniconfig into it)
#   h200.sh starts CASES     on the host, the call after the last part: assemble and install
#                            (once per machine), check what loads, then
#                            benchmarks/gpu/starts.py --cases CASES; everything under $OUT
#   h200.sh selftest CASES   the same, then `sparkserve selftest` of the default recipe's
#                            geometry (8 layers) for CASES (plain,dflash,mtp,bf16), stopped
#                            before the call's 600 s; its table, JSON and server logs come back
#                            as $OUT/selftest.tgz, the cache files before and after in
#                            $OUT/caches.txt; HF_HOME under /tmp stays for the next call (the
#                            caches a later case reuses; benchmarks/gpu/selftest_merge.py
#                            compares cases run in different calls)
#   h200.sh verify           the same install, then `sparkserve verify` with the launcher driver
#                            (--gen-tokens GEN_TOKENS, 32) against serve.sh serving the
#                            selftest's models of the default recipe (8 layers; DFlash, int8
#                            head, prefix caching; benchmarks/gpu/verify_server.py starts it).
#                            The run goes on in a session of its own (h200.sh verify-run, at
#                            most VERIFY_LIMIT_S, 900, then SIGINT: verify restores and writes
#                            what it read), since a cold start and 4 restarts outlast one
#                            call; this call follows its log until it ends or until
#                            WAIT_UNTIL_S (570). Call `h200.sh verify` again within the 30 s the
#                            machine stays warm to follow it on (INT_AT_S=N: SIGINT to
#                            verify at this call's second N if it still runs). Each call brings back
#                            OUT/verify.tgz (the run's folder: verify's output, every server
#                            log, the command), verify.json, verify.png, verify_table.txt and
#                            run.log as far as they are written; the exit status is verify's
#                            once it ended, 0 while it runs on
#   h200.sh decode-speed     the same install, then benchmarks/gpu/decode_speed.py: serve.sh
#                            as the selftest's plain (int8 head) and bf16 cases start it, the
#                            default recipe's geometry at LAYERS (48) layers with its int4
#                            quantization_config and dummy weights, no speculation: decode tok/s
#                            at STREAMS (1,2,4,8), prefill and cached-turn TTFT at PREFILL
#                            (2048,8192,32768), the copy bandwidth, the bytes model beside each
#                            figure; OUT/decode_speed.json and .png, the server logs as
#                            OUT/decode_speed_logs.tgz. HEADS=int8 or HEADS=bf16 runs one head
#                            (one call each, if one call's 600 s do not hold both)
#   h200.sh spec-cost        the same install, then benchmarks/gpu/spec_cost.py: the selftest's
#                            CASES (plain,dflash; or mtp, or plain,dflash,mtp) at LAYERS (48)
#                            layers, dummy weights; the step at every acceptance (set per step
#                            by benchmarks/gpu/spec_accept.py, on those servers alone; DFlash
#                            n=DFLASH_TOKENS 12, MTP n=MTP_TOKENS 2) at STREAMS (1,2), STEPS
#                            (64) steps a run; OUT/spec_cost.json and .png, the server logs as
#                            OUT/spec_cost_logs.tgz. A case not started before the call's
#                            585 s is left for a later call on the same machine (its caches
#                            kept); join the calls' JSON with spec_cost.py --merge. The
#                            recipe's 67 GiB of weights need an H200 at 48 layers; on an H100
#                            use the depth decode-speed ran at (the ratios depend on depth)
#   TRIAL_PATCH=NAME         selftest and verify with a trial patch (docs/PATCHES.md,
#                            sparkserve.patching.TRIAL_PATCHES; none is on trial now) applied
#                            to the installed vLLM for the run and reverted after it
#
# Every step prints its seconds; the host's own torch, triton and CUDA stay as they are.
set -euo pipefail

readonly ROOT="${SPARKGPU_ROOT:-/tmp/sparkgpu}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly REPO="${repo}"
readonly BUNDLE="${REPO}/${BUNDLE_DIR:-.gl/bundle}"

step() {
  printf '[h200 %s] %s\n' "$(date -u +%T)" "$*"
}

stash() {
  local part="$1" file="${BUNDLE}/p.$1"
  [[ "${part}" =~ ^[0-9]$ ]] || { echo "h200.sh: stash ${part}: a part number 0-9" >&2; exit 2; }
  [[ -f "${file}" ]] || { echo "h200.sh: stash ${part}: ${file} did not travel (carry it)" >&2; exit 2; }
  mkdir -p "${ROOT}/parts"
  cp "${file}" "${ROOT}/parts/"
  step "part ${part} stashed: $(cd "${ROOT}/parts" && echo p.*)"
}

# every wheel in $1 unpacked into the one folder on PYTHONPATH (no pip, no index on the host)
extract_wheels() {
  python3 - "$1" "${ROOT}/site" <<'PY'
import sys, zipfile
from pathlib import Path
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    zipfile.ZipFile(wheel).extractall(sys.argv[2])
PY
}

install() {
  if [[ -f "${ROOT}/installed" ]]; then
    step "installed already on this machine"
    return
  fi
  local began="${SECONDS}"
  mkdir -p "${ROOT}/bundle" "${ROOT}/site" "${ROOT}/bin"
  cat "${ROOT}"/parts/p.* | tar -C "${ROOT}/bundle" -x
  extract_wheels "${ROOT}/bundle/wheels"
  # this checkout (not the bundle's copy), so that its entry points make it vLLM's plugin
  python3 -m pip install -q --no-deps --no-build-isolation --target "${ROOT}/site" "${REPO}"
  # vLLM spawns its engine: the entry script needs the __main__ guard
  cat > "${ROOT}/bin/vllm" <<'PY'
#!/usr/bin/env python3
import sys

from vllm.entrypoints.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
PY
  chmod +x "${ROOT}/bin/vllm"
  # the image's build-time vLLM patches (docker/finish-image.sh), as the Spark image has them
  (host_env && "${REPO}/docker/apply-vllm-patches.sh" python3)
  touch "${ROOT}/installed"
  step "installed in $((SECONDS - began)) s"
}

host_env() {
  # the host's user site (where its torch may live) stays importable under another HOME
  local user_site
  user_site="$(python3 -c 'import site; print(site.getusersitepackages())')"
  # this checkout's package first: its recipes and launchers are found beside it (installed in
  # site/ alone, it would look for the image's); site/ keeps its entry points (vLLM's plugin)
  export PYTHONPATH="${REPO}/src:${ROOT}/site:${user_site}"
  export PATH="${ROOT}/bin:${PATH}"
}

gpu_tests() {
  install
  # pytest's wheels travel beside a part (carry .gl/pytest: pip download pytest pluggy iniconfig)
  [[ -d "${REPO}/.gl/pytest" ]] || { echo "h200.sh: tests: .gl/pytest did not travel" >&2; exit 2; }
  extract_wheels "${REPO}/.gl/pytest"
  host_env
  step "the lm-head's tests on this GPU"
  (cd "${REPO}" && PYTHONPATH="${REPO}/src:${REPO}/tests:${PYTHONPATH}" \
    python3 -m pytest -p no:cacheprovider -q tests/in_vllm/lmhead)
}

# TRIAL_PATCH's patch applied to (or, with --revert, taken off) the installed vLLM; nothing
# without TRIAL_PATCH. An unknown name is sparkserve patch's own one-line refusal.
trial_patch() {
  [[ -n "${TRIAL_PATCH:-}" ]] || return 0
  python3 -m sparkserve patch "${TRIAL_PATCH}" "$@"
}

# the GPU, its memory and driver, printed and kept in OUT/gpu.txt
gpu_line() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$1/gpu.txt"
}

starts() {
  local cases="$1" out="${OUT:?h200.sh: OUT names the folder whose files come back}"
  install
  host_env
  gpu_line "${out}"
  python3 - <<'PY' | tee "${out}/stack.txt"
from importlib.metadata import entry_points, version
import torch, triton, vllm
print("vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__,
      "gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
print("plugins", sorted(e.name for e in entry_points(group="vllm.general_plugins")),
      "sparkserve", version("sparkserve"))
PY
  step "starts: ${cases}"
  python3 -u "${REPO}/benchmarks/gpu/starts.py" --work "${ROOT}/work" --out "${out}" \
    --cases "${cases}" --deadline-s "${DEADLINE_S:-$((585 - SECONDS))}" \
    --case-budget-s "${CASE_BUDGET_S:-200}"
}

# files in vLLM's and Triton's caches on the volume: what a start compiled and kept
cache_files() {
  local dir count
  for dir in vllm triton; do
    count=0
    [[ -d "${ROOT}/hf/${dir}" ]] && count="$(find "${ROOT}/hf/${dir}" -type f | wc -l)"
    printf '%s=%s ' "${dir}" "${count}"
  done
  echo
}

selftest() {
  local cases="$1" out="${OUT:?h200.sh: OUT names the folder whose files come back}"
  install
  host_env
  gpu_line "${out}"
  echo "before: $(cache_files)" | tee "${out}/caches.txt"
  # one call may run 600 s: SIGINT before that stops the servers and keeps each finished
  # case's JSON; the folder travels as one file (a call brings back 8 files at most)
  local left=$((570 - SECONDS))
  step "selftest: ${cases} (at most ${left} s)"
  # what this host needs that the Spark image does not: no flashinfer in the bundle (FACTS
  # "vLLM's CUDA build on an H200 host")
  local status=0
  trial_patch
  HF_HOME="${ROOT}/hf" VLLM_USE_FLASHINFER_SAMPLER=0 \
    EXTRA_ARGS="--additional-config '{\"gdn_prefill_backend\": \"triton\"}'" \
    timeout -s INT -k 20 "${left}" python3 -u -m sparkserve selftest --cases "${cases}" \
    --out "${ROOT}/selftest" --start-timeout-s "${START_TIMEOUT_S:-540}" || status=$?
  trial_patch --revert
  echo "after: $(cache_files)" | tee -a "${out}/caches.txt"
  tar -C "${ROOT}" -czf "${out}/selftest.tgz" selftest
  rm -rf "${ROOT}/selftest"
  step "selftest: exit ${status}"
  return "${status}"
}

# a GPU benchmark script with what this host needs that the Spark image does not (as
# selftest), stopped before the call's 585 s
gpu_benchmark() {
  HF_HOME="${ROOT}/hf" VLLM_USE_FLASHINFER_SAMPLER=0 \
    EXTRA_ARGS="--additional-config '{\"gdn_prefill_backend\": \"triton\"}'" \
    timeout -s INT -k 20 "$((585 - SECONDS))" python3 -u "$@"
}

# DIR/NAME.json and DIR/NAME.png into OUT (as far as they are written), DIR/work (the server
# logs) as OUT/NAME_logs.tgz
bring_back() {
  local dir="$1" name="$2" out="$3" file
  for file in "${name}.json" "${name}.png"; do
    if [[ -f "${dir}/${file}" ]]; then cp "${dir}/${file}" "${out}/"; fi
  done
  if [[ -d "${dir}/work" ]]; then tar -C "${dir}" -czf "${out}/${name}_logs.tgz" work; fi
}

decode_speed() {
  local out="${OUT:?h200.sh: OUT names the folder whose files come back}" status=0
  install
  host_env
  gpu_line "${out}"
  step "decode-speed: ${LAYERS:-48} layers, heads ${HEADS:-int8,bf16}, streams ${STREAMS:-1,2,4,8}"
  gpu_benchmark "${REPO}/benchmarks/gpu/decode_speed.py" \
    --out "${ROOT}/decode" --layers "${LAYERS:-48}" --heads "${HEADS:-int8,bf16}" \
    --streams "${STREAMS:-1,2,4,8}" --prefill "${PREFILL:-2048,8192,32768}" \
    --gen-tokens "${GEN_TOKENS:-256}" --start-timeout-s "${START_TIMEOUT_S:-420}" || status=$?
  bring_back "${ROOT}/decode" decode_speed "${out}"
  step "decode-speed: exit ${status}"
  return "${status}"
}

spec_cost() {
  local out="${OUT:?h200.sh: OUT names the folder whose files come back}" status=0
  install
  host_env
  gpu_line "${out}"
  step "spec-cost: ${CASES:-plain,dflash} at ${LAYERS:-48} layers, streams ${STREAMS:-1,2}"
  rm -rf "${ROOT}/spec"
  gpu_benchmark "${REPO}/benchmarks/gpu/spec_cost.py" \
    --out "${ROOT}/spec" --cases "${CASES:-plain,dflash}" --layers "${LAYERS:-48}" \
    --streams "${STREAMS:-1,2}" --steps "${STEPS:-64}" --dflash-tokens "${DFLASH_TOKENS:-12}" \
    --mtp-tokens "${MTP_TOKENS:-2}" --start-timeout-s "${START_TIMEOUT_S:-480}" \
    --deadline-s "$((570 - SECONDS))" || status=$?
  bring_back "${ROOT}/spec" spec_cost "${out}"
  step "spec-cost: exit ${status}"
  return "${status}"
}

# SIGTERM to the server's process group (the launcher's pid, which verify keeps current in
# the pid file), SIGKILL after 60 s
stop_server() {
  local pid waited=0
  pid="$(cat "$1/server.pid" 2>/dev/null)" || return 0
  [[ "${pid}" =~ ^[0-9]+$ ]] || return 0
  kill -TERM -- "-${pid}" 2>/dev/null || return 0
  while kill -0 -- "-${pid}" 2>/dev/null && (( waited < 60 )); do
    sleep 1
    waited=$((waited + 1))
  done
  kill -KILL -- "-${pid}" 2>/dev/null || true
  step "server stopped (launcher pid ${pid}, ${waited} s)"
}

# the run `h200.sh verify` starts in a session of its own: the server, verify, the stop
verify_run() {
  local work="${ROOT}/verify" status=0
  host_env
  # what this host needs that the Spark image does not (as selftest): the launcher's
  # environment, so every restart's too
  export HF_HOME="${ROOT}/hf" VLLM_USE_FLASHINFER_SAMPLER=0
  export EXTRA_ARGS="--additional-config '{\"gdn_prefill_backend\": \"triton\"}'"
  trial_patch
  step "serve.sh: the selftest's models (default recipe, 8 layers), DFlash, int8 head, prefix caching"
  if python3 -u "${REPO}/benchmarks/gpu/verify_server.py" --work "${work}" \
      --timeout-s "${START_TIMEOUT_S:-900}"; then
    step "serve.sh healthy after ${SECONDS} s"
    local command=(python3 -u -m sparkserve verify --driver launcher --launcher dflash
      --pid-file "${work}/server.pid" --url "$(cat "${work}/url")" --out "${work}/out"
      --gen-tokens "${GEN_TOKENS:-32}" --checks "${VERIFY_CHECKS:-api,prefix,speculation,head}"
      --healthy-timeout-s 600)
    # the key stays in its file
    printf 'API_KEY="<%s>" timeout -s INT -k 300 %s %s\n' "${work}/key" \
      "${VERIFY_LIMIT_S:-900}" "${command[*]}" > "${work}/command.txt"
    step "verify: $(cat "${work}/command.txt")"
    API_KEY="$(cat "${work}/key")" timeout -s INT -k 300 "${VERIFY_LIMIT_S:-900}" \
      "${command[@]}" > "${work}/verify.txt" &
    echo "$!" > "${work}/verify.pid"
    wait "$!" || status=$?
    step "verify: exit ${status} after ${SECONDS} s"
  else
    status=$?
    step "serve.sh: not healthy (exit ${status})"
  fi
  stop_server "${work}"
  trial_patch --revert
  echo "${status}" > "${work}/rc"
}

# the run's folder and its main files into OUT (as far as they are written)
verify_collect() {
  local work="$1" out="$2" file
  for file in out/verify.json out/verify.png run.log; do
    if [[ -f "${work}/${file}" ]]; then cp "${work}/${file}" "${out}/"; fi
  done
  if [[ -f "${work}/verify.txt" ]]; then cp "${work}/verify.txt" "${out}/verify_table.txt"; fi
  # a server may still write its log: tar's 1 is "changed as we read it"
  tar -C "${ROOT}" --warning=no-file-changed -czf "${out}/verify.tgz" verify || (( $? == 1 ))
}

verify_gpu() {
  local out="${OUT:?h200.sh: OUT names the folder whose files come back}"
  local work="${ROOT}/verify" shown=0 lines status
  install
  gpu_line "${out}"
  if [[ -f "${work}/job.pid" ]]; then
    step "verify: the run this machine began goes on (pid $(cat "${work}/job.pid"))"
  else
    rm -rf "${work}"
    mkdir -p "${work}"
    : > "${work}/run.log"
    setsid bash "${REPO}/benchmarks/gpu/h200.sh" verify-run < /dev/null > "${work}/run.log" 2>&1 &
    echo "$!" > "${work}/job.pid"
    step "verify: started in a session of its own (pid $!, log ${work}/run.log)"
  fi
  while [[ ! -f "${work}/rc" ]] && (( SECONDS < ${WAIT_UNTIL_S:-570} )); do
    lines="$(wc -l < "${work}/run.log")"
    if (( lines > shown )); then
      sed -n "$((shown + 1)),${lines}p" "${work}/run.log"
      shown="${lines}"
    fi
    kill -0 "$(cat "${work}/job.pid")" 2>/dev/null || break
    # INT_AT_S: this call's second at which verify is told to stop (SIGINT to its timeout, which
    # passes it on): verify restores the starting setting and writes what it read
    if [[ -n "${INT_AT_S:-}" && -f "${work}/verify.pid" && ! -f "${work}/verify.int" ]] &&
        (( SECONDS >= INT_AT_S )); then
      kill -INT "$(cat "${work}/verify.pid")" 2>/dev/null || true
      touch "${work}/verify.int"
      step "verify: SIGINT at ${SECONDS} s (INT_AT_S)"
    fi
    sleep 5
  done
  sed -n "$((shown + 1)),\$p" "${work}/run.log"
  verify_collect "${work}" "${out}"
  if [[ -f "${work}/rc" ]]; then
    status="$(cat "${work}/rc")"
    step "verify: done, exit ${status}"
    return "${status}"
  fi
  if ! kill -0 "$(cat "${work}/job.pid")" 2>/dev/null; then
    step "verify: the run ended without an exit status (run.log)"
    return 3
  fi
  step "verify: runs on; call 'h200.sh verify' again within 30 s to follow it"
}

case "${1:-}" in
  stash) stash "${2:?h200.sh stash N}" ;;
  tests) gpu_tests ;;
  starts) starts "${2:?h200.sh starts CASES}" ;;
  selftest) selftest "${2:?h200.sh selftest CASES}" ;;
  verify) verify_gpu ;;
  verify-run) verify_run ;;
  decode-speed) decode_speed ;;
  spec-cost) spec_cost ;;
  *) echo "h200.sh: ${1:-no command}: one of stash N, tests, starts CASES, selftest CASES," \
       "verify, decode-speed, spec-cost" >&2
     exit 2 ;;
esac
