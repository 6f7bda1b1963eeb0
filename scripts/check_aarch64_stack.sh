#!/usr/bin/env bash
# Check the Spark image's Python stack (requirements/spark-aarch64.lock) for linux/aarch64 on an
# x86_64 machine, with no Spark and no GPU:
#   native    the exact cp312 lock installs, every hash verified, for the Spark's platform
#             (aarch64, glibc 2.39 of Ubuntu 24.04, CPython 3.12), all packages, into a scratch
#             folder (uv --target; nothing runs);
#   emulated  an arm64 Debian bookworm chroot run by qemu-user-static gets the same pins for its
#             CPython 3.11 (pins with no cp311 wheel fall back to their previous release, for
#             this check only, printed as such) and imports torch, vllm, vLLM's OpenAI API server
#             module and loads every compiled extension of vllm against a stub libcuda.so.1.
# It cannot prove: CPython 3.12 under emulation, the substituted pins, any GPU kernel (the
# stub libcuda has no driver behind it), Ubuntu 24.04's glibc at run time (bookworm's is 2.36).
#
# Usage: scripts/check_aarch64_stack.sh [--only native|emulated] [--report PATH] [--lock PATH]
# The emulated check needs root (apt, chroot, mounts in a private mount namespace) and Debian's
# apt; the native one needs python3 and uv (from PATH, else the pinned uv in a cached venv). Everything is
# cached under $SPARKSERVE_CACHE/aarch64 (default ~/.cache/sparkserve/aarch64), keyed on the
# lock's content: a second run reuses the rootfs, the wheels and the installed stack.
# Prints one PASS/FAIL line per check and a summary; exits 1 on any failure, 2 on bad arguments.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="${REPO}/scripts/check_aarch64_stack.sh"
LIB="${REPO}/scripts/lib"
readonly SUITE=bookworm
# The Spark's platform (DGX OS is Ubuntu 24.04: glibc 2.39) and the chroot's (bookworm: 2.36).
readonly SPARK_PLATFORM=aarch64-manylinux_2_39 SPARK_PYTHON=3.12
readonly CHROOT_PLATFORM=aarch64-manylinux_2_36 CHROOT_PYTHON=3.11
# Pins that may lack a cp311 wheel; each is checked, and replaced only when it has none.
readonly CP311_CANDIDATES=(networkx contourpy)
readonly HOST_PACKAGES=(qemu-user-static binfmt-support debootstrap gcc-aarch64-linux-gnu)
readonly CHROOT_ENV=(HOME=/root PATH=/usr/local/bin:/usr/bin:/bin PYTHONPATH=/opt/stack
  LD_LIBRARY_PATH=/opt/cuda-stub PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)

progress() {
  printf '[aarch64] %s\n' "$*" >&2
}

usage_error() {
  printf 'check_aarch64_stack.sh: %s\n' "$1" >&2
  exit 2
}

# --- the mount namespace side: `SELF __chroot ROOTFS STACK STUB PROBES -- CMD...` (also by hand,
# to rerun one probe: it re-enters itself through unshare, so it never mounts on the host) ---

inside_cleanup() {
  local root="$1" fake="$2"
  local target
  for target in sys/devices/system/cpu sys proc/cpuinfo proc dev opt/probes opt/cuda-stub \
    opt/stack; do
    if mountpoint -q "${root}/${target}"; then
      umount -R "${root}/${target}" || umount -l "${root}/${target}" || true
    fi
  done
  rm -rf "${fake}"
}

# An aarch64 /proc/cpuinfo and cpu sysfs tree (Cortex-X925 ids, one entry per host CPU): torch's
# cpuinfo aborts at import under qemu-user when it reads the host's x86 ones.
write_fake_cpu() {
  local dir="$1" cpus="$2"
  local cpu
  mkdir -p "${dir}/sys"
  : >"${dir}/cpuinfo"
  for ((cpu = 0; cpu < cpus; cpu++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 2000.00\nFeatures\t: %s\nCPU implementer\t: 0x41\n' \
      "${cpu}" "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
lrcpc dcpop asimddp" >>"${dir}/cpuinfo"
    printf 'CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd85\nCPU revision\t: 0\n\n' \
      >>"${dir}/cpuinfo"
    mkdir -p "${dir}/sys/cpu${cpu}/regs/identification"
    printf '0x00000000410fd850\n' >"${dir}/sys/cpu${cpu}/regs/identification/midr_el1"
  done
  local range="0-$((cpus - 1))"
  printf '%s\n' "${range}" >"${dir}/sys/possible"
  printf '%s\n' "${range}" >"${dir}/sys/present"
  printf '%s\n' "${range}" >"${dir}/sys/online"
}

# qemu-aarch64 registered with binfmt_misc (Debian registers it with the F flag, so the chroot
# needs no emulator inside). binfmt_misc is mounted in this private namespace only.
inside_binfmt() {
  local dir=/proc/sys/fs/binfmt_misc
  if [[ ! -e "${dir}/register" ]]; then
    mount -t binfmt_misc binfmt_misc "${dir}"
  fi
  if [[ ! -e "${dir}/qemu-aarch64" ]]; then
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || update-binfmts --import qemu-aarch64
  fi
  grep -qx enabled "${dir}/qemu-aarch64"
}

inside_chroot() {
  local root="$1" stack="$2" stub="$3" probes="$4"
  shift 5 # the fifth argument is the `--` before the command
  local fake
  fake="$(mktemp -d)"
  trap 'inside_cleanup "'"${root}"'" "'"${fake}"'"' EXIT
  inside_binfmt
  if [[ "${stack}" == - ]]; then # debootstrap's second stage mounts what it needs itself
    chroot "${root}" "$@"
    return
  fi
  write_fake_cpu "${fake}" "$(nproc)"
  mkdir -p "${root}/opt/stack" "${root}/opt/cuda-stub" "${root}/opt/probes"
  mount --rbind /dev "${root}/dev"
  mount -t proc proc "${root}/proc"
  mount --bind "${fake}/cpuinfo" "${root}/proc/cpuinfo"
  mount -t tmpfs -o size=1m sysfs-stub "${root}/sys"
  mkdir -p "${root}/sys/devices/system/cpu"
  mount --bind "${fake}/sys" "${root}/sys/devices/system/cpu"
  mount --bind "${stack}" "${root}/opt/stack"
  mount --bind "${stub}" "${root}/opt/cuda-stub"
  mount --bind -o ro "${probes}" "${root}/opt/probes"
  chroot "${root}" /usr/bin/env -i "${CHROOT_ENV[@]}" "$@"
}

# Runs CMD... in the chroot from a private mount namespace: whatever happens, nothing stays
# mounted on the host (the namespace dies with the command; its EXIT trap unmounts first).
in_chroot() {
  unshare --mount --propagation private -- env SPARKSERVE_AARCH64_PRIVATE_NS=1 \
    "${SELF}" __chroot "$@"
}

# --- the host side ---

cache_root() {
  printf '%s/aarch64\n' "${SPARKSERVE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/sparkserve}"
}

key_of() {
  cat "$@" | sha256sum | cut -c1-16
}

ensure_host_tools() {
  local missing=() package
  for package in "${HOST_PACKAGES[@]}"; do
    if ! dpkg-query -W -f '${Status}' "${package}" 2>/dev/null | grep -q 'ok installed'; then
      missing+=("${package}")
    fi
  done
  if ((${#missing[@]})); then
    progress "apt: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# uv from PATH (scripts/test.sh's venv has the locked one), else that pin in a cached venv.
ensure_uv() {
  local base="$1"
  if command -v uv >/dev/null; then
    command -v uv
    return
  fi
  local pin venv
  pin="$(python3 "${REPO}/scripts/lib/locks.py" pin test-core uv)"
  venv="${base}/uv-$(printf '%s' "${pin}" | sha256sum | cut -c1-16)"
  if [[ ! -f "${venv}/.complete" ]]; then
    progress "installing ${pin%% *} (requirements/test-core.lock) into ${venv}"
    rm -rf "${venv}"
    python3 -m venv "${venv}"
    "${venv}/bin/python" -m pip install --quiet --no-deps --require-hashes \
      -r <(printf '%s' "${pin}")
    touch "${venv}/.complete"
  fi
  printf '%s\n' "${venv}/bin/uv"
}

# uv pip install of a whole hash-locked file for another platform into TARGET (no interpreter
# of that platform needed; only wheels, every hash checked).
uv_install_locked() {
  local lock="$1" target="$2" platform="$3" python="$4"
  "${UV}" pip install --quiet --require-hashes --only-binary :all: --no-config \
    --python-platform "${platform}" --python-version "${python}" --target "${target}" \
    -r "${lock}"
}

lock_version() {
  local name="$1"
  python3 "${LIB}/aarch64_lock.py" pins "${LOCK}" | sed -n "s/^${name}==//Ip"
}

installed_count() {
  local target="$1"
  find "${target}" -maxdepth 1 -name '*.dist-info' | wc -l
}

# (a) the exact lock, as the Spark image installs it.
check_native() {
  local scratch="$1"
  local target="${scratch}/cp312"
  local wanted got
  wanted="$(python3 "${LIB}/aarch64_lock.py" pins "${LOCK}" | wc -l)"
  progress "native: uv pip install --require-hashes, ${wanted} pins, ${SPARK_PLATFORM}" \
    "CPython ${SPARK_PYTHON} (downloads are cached)"
  DETAIL="uv pip install of the lock failed (its error is above)"
  uv_install_locked "${LOCK}" "${target}" "${SPARK_PLATFORM}" "${SPARK_PYTHON}"
  got="$(installed_count "${target}")"
  rm -rf "${target}"
  if ((got != wanted)); then
    DETAIL="installed ${got} packages, the lock pins ${wanted}"
    return 1
  fi
  DETAIL="${got} packages, hashes verified, for ${SPARK_PLATFORM} cp${SPARK_PYTHON/./}"
}

# The lock for the chroot's CPython: each candidate pin without a cp311 wheel is replaced by the
# newest earlier release that has one (with its own hashes). Prints the substitutions.
write_cp311_lock() {
  local out="$1"
  local name version replaced=() subst=()
  local probe_in="${SCRATCH}/cp311-probe.in" probe_err="${SCRATCH}/cp311-probe.err"
  # uv reads an existing --output-file as preferred pins: this one must start absent.
  local probe_out="${SCRATCH}/cp311-substitutes.txt"
  for name in "${CP311_CANDIDATES[@]}"; do
    version="$(lock_version "${name}")"
    [[ -n "${version}" ]] || continue
    printf '%s==%s\n' "${name}" "${version}" >"${probe_in}"
    if "${UV}" pip compile --quiet --no-config --no-deps --only-binary :all: \
      --python-platform "${CHROOT_PLATFORM}" --python-version "${CHROOT_PYTHON}" \
      --output-file /dev/null "${probe_in}" 2>"${probe_err}"; then
      continue
    fi
    # Only "no solution" means no cp311 wheel; anything else (network, index) is an error.
    if ! grep -q 'No solution found' "${probe_err}"; then
      cat "${probe_err}" >&2
      return 1
    fi
    replaced+=("${name}")
    subst+=("${name}<${version}")
  done
  if ((${#replaced[@]} == 0)); then
    cp "${LOCK}" "${out}"
    return
  fi
  printf '%s\n' "${subst[@]}" >"${probe_in}"
  "${UV}" pip compile --quiet --no-config --no-deps --only-binary :all: --generate-hashes \
    --no-header --no-annotate --python-platform "${CHROOT_PLATFORM}" \
    --python-version "${CHROOT_PYTHON}" --output-file "${probe_out}" "${probe_in}"
  {
    python3 "${LIB}/aarch64_lock.py" drop "${LOCK}" "${replaced[@]}"
    cat "${probe_out}"
  } >"${out}"
  for name in "${replaced[@]}"; do
    printf '%s==%s -> %s (no cp%s wheel; this check only)\n' "${name}" \
      "$(lock_version "${name}")" "$(grep -i "^${name}==" "${probe_out}" | cut -d' ' -f1)" \
      "${CHROOT_PYTHON/./}"
  done
}

default_mirror() {
  local uri
  uri="$(grep -hs -m1 '^URIs:' /etc/apt/sources.list.d/debian.sources | awk '{print $2}')"
  printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

# An arm64 Debian with python3 at ROOTFS, built once (debootstrap's first stage on the host,
# the second under emulation).
ensure_rootfs() {
  local base="$1"
  local mirror="${SPARKSERVE_DEBIAN_MIRROR:-$(default_mirror)}"
  if [[ -f "${ROOTFS}/.complete" ]]; then
    DETAIL="reused ${ROOTFS##*/}"
    return
  fi
  rm -rf "${ROOTFS}"
  progress "rootfs: debootstrap --arch=arm64 --foreign ${SUITE} from ${mirror}"
  DETAIL="debootstrap's first stage failed: see ${base}/debootstrap.log"
  debootstrap --arch=arm64 --foreign --variant=minbase --include=python3 "${SUITE}" \
    "${ROOTFS}" "${mirror}" >"${base}/debootstrap.log" 2>&1
  progress "rootfs: second stage under qemu-aarch64 (log: ${base}/debootstrap.log)"
  DETAIL="debootstrap's second stage (emulated) failed: see ${base}/debootstrap.log"
  in_chroot "${ROOTFS}" - - - -- /debootstrap/debootstrap --second-stage \
    >>"${base}/debootstrap.log" 2>&1
  rm -rf "${ROOTFS}"/var/cache/apt/archives/*.deb "${ROOTFS}"/var/lib/apt/lists/*
  touch "${ROOTFS}/.complete"
  DETAIL="built from ${mirror}, $(in_chroot "${ROOTFS}" - - - -- python3 -V)"
}

# The cp311 stack at STACK, installed once per content of its lock (older stacks are removed:
# ~9 GB each).
ensure_stack() {
  local base="$1"
  if [[ -f "${STACK}/.complete" ]]; then
    DETAIL="reused ${STACK##*/}"
    return
  fi
  find "${base}" -maxdepth 1 -name "stack-cp${CHROOT_PYTHON/./}-*" -exec rm -rf {} +
  progress "stack: uv pip install --require-hashes for ${CHROOT_PLATFORM} CPython ${CHROOT_PYTHON}"
  DETAIL="uv pip install of the cp311 lock failed (its error is above)"
  uv_install_locked "${SCRATCH}/cp311.lock" "${STACK}" "${CHROOT_PLATFORM}" "${CHROOT_PYTHON}"
  touch "${STACK}/.complete"
  DETAIL="$(installed_count "${STACK}") packages, hashes verified"
}

# A libcuda.so.1 stub at CUDA_STUB: every driver-API symbol (cu[A-Z]...) that vllm's shared
# objects import, each returning CUDA_ERROR_NO_DEVICE (100). Enough for the dynamic linker; no
# kernel can run.
ensure_cuda_stub() {
  local base="$1"
  if [[ ! -f "${CUDA_STUB}/.complete" ]]; then
    rm -rf "${base}"/cuda-stub-*
    mkdir -p "${CUDA_STUB}"
    DETAIL="building the stub failed (its error is above)"
    find "${STACK}/vllm" -name '*.so' -print0 |
      xargs -0 aarch64-linux-gnu-nm -D --undefined-only |
      awk '$2 ~ /^cu[A-Z]/ {sub(/@.*/, "", $2); print $2}' | sort -u >"${CUDA_STUB}/symbols.txt"
    awk '{printf "int %s(void) { return 100; }\n", $1}' "${CUDA_STUB}/symbols.txt" \
      >"${CUDA_STUB}/stub.c"
    aarch64-linux-gnu-gcc -shared -fPIC -Wl,-soname,libcuda.so.1 \
      -o "${CUDA_STUB}/libcuda.so.1" "${CUDA_STUB}/stub.c"
    touch "${CUDA_STUB}/.complete"
  fi
  DETAIL="$(wc -l <"${CUDA_STUB}/symbols.txt") driver symbols"
}

# One probe in the chroot; its JSON line becomes the check's detail.
probe() {
  local name="$1"
  local out
  local substituted
  substituted="$(cut -d= -f1 <<<"${SUBSTITUTIONS}" | paste -sd, -)"
  out="$(in_chroot "${ROOTFS}" "${STACK}" "${CUDA_STUB}" "${LIB}" -- \
    env SPARKSERVE_SUBSTITUTED="${substituted}" python3 /opt/probes/aarch64_probe.py "${name}" \
    2>"${SCRATCH}/probe-${name}.log")" || {
    tail -n 20 "${SCRATCH}/probe-${name}.log" >&2
    DETAIL="$(tail -n1 <<<"${out}")"
    [[ -n "${DETAIL}" ]] || DETAIL="$(tail -n3 "${SCRATCH}/probe-${name}.log" | tr '\n' ' ')"
    return 1
  }
  DETAIL="$(tail -n1 <<<"${out}")"
}

# Probe results must name the lock's own releases (the stack really is the lock's).
probe_versions_match() {
  local key="$1" package="$2"
  local seen
  seen="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' \
    "${DETAIL}" "${key}")"
  if [[ "${seen}" != "$(lock_version "${package}")" ]]; then
    DETAIL="imported ${package} ${seen}, the lock pins $(lock_version "${package}")"
    return 1
  fi
}

probe_torch() {
  probe torch && probe_versions_match torch torch
}

probe_vllm() {
  probe vllm && probe_versions_match vllm vllm
}

probe_api_server() {
  probe api_server
}

probe_extensions() {
  probe extensions
}

# run_check NAME FN ARGS... : runs FN in a subshell with errexit on, records PASS/FAIL, its
# time and the DETAIL line FN left; CHECK_OK says which. Never call it in a condition (`if`,
# `||`): bash would then ignore errexit inside FN. FN shares state only through paths.
run_check() {
  local name="$1" fn="$2"
  shift 2
  local started status rc seconds
  started=${SECONDS}
  set +e
  (
    set -e
    DETAIL=""
    trap 'printf "%s" "${DETAIL}" >"${SCRATCH}/detail"' EXIT
    "${fn}" "$@"
  )
  rc=$?
  set -e
  DETAIL="$(cat "${SCRATCH}/detail" 2>/dev/null || true)"
  if ((rc != 0)) && [[ -z "${DETAIL}" ]]; then
    DETAIL="exit status ${rc} (see the output above)"
  fi
  status=PASS
  ((rc == 0)) || status=FAIL
  seconds=$((SECONDS - started))
  record "${name}" "${status}" "${seconds}" "${DETAIL}"
  CHECK_OK=$((rc == 0))
}

record() {
  local name="$1" status="$2" seconds="$3" detail="$4"
  printf '%s\t%s\t%s\t%s\n' "${name}" "${status}" "${seconds}" "${detail//$'\n'/ }" \
    >>"${SCRATCH}/results.tsv"
  printf '%s %s (%s s): %s\n' "${status}" "${name}" "${seconds}" "${detail:0:400}"
}

skip_checks() {
  local why="$1"
  shift
  local name
  for name in "$@"; do
    record "${name}" SKIP 0 "not run: ${why}"
  done
}

write_report() {
  local out="$1" started_at="$2"
  python3 - "${SCRATCH}/results.tsv" "${out}" <<PY
import json, platform, shutil, subprocess, sys
checks = []
for line in open(sys.argv[1]):
    name, status, seconds, detail = line.rstrip("\n").split("\t", 3)
    try:
        detail = json.loads(detail)
    except ValueError:
        pass
    checks.append({"check": name, "status": status, "seconds": int(seconds), "detail": detail})
qemu = shutil.which("qemu-aarch64-static")
if qemu:
    qemu = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout
    qemu = qemu.splitlines()[0] if qemu else None
report = {
    "what": "the Spark image's Python stack for linux/aarch64 (scripts/check_aarch64_stack.sh)",
    "started_utc": "${started_at}",
    "host": {"machine": platform.machine(), "kernel": platform.release(),
             "qemu": qemu},
    "lock": {"path": "${LOCK_NAME}", "sha256": "${LOCK_SHA}", "pins": ${PIN_COUNT},
             "torch": "$(lock_version torch)", "vllm": "$(lock_version vllm)"},
    "native": {"platform": "${SPARK_PLATFORM}", "python": "${SPARK_PYTHON}"},
    "emulated": {"suite": "${SUITE}", "platform": "${CHROOT_PLATFORM}",
                 "python": "${CHROOT_PYTHON}",
                 "substituted": [s for s in """${SUBSTITUTIONS}""".splitlines() if s]},
    "cannot_prove": [
        "CPython 3.12 under emulation (the chroot runs bookworm's 3.11)",
        "the substituted pins at their locked releases",
        "any GPU kernel: the libcuda.so.1 is a stub with no driver, nothing ran on a GPU",
        "Ubuntu 24.04's glibc 2.39 at run time (bookworm has 2.36)",
    ],
    "checks": checks,
    "passed": all(c["status"] == "PASS" for c in checks),
}
with open(sys.argv[2], "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")
PY
}

parse_args() {
  ONLY=all
  REPORT=""
  LOCK="${REPO}/requirements/spark-aarch64.lock"
  while (($#)); do
    case "$1" in
      --only)
        (($# >= 2)) || usage_error "--only needs a value: native or emulated"
        [[ "$2" == native || "$2" == emulated ]] ||
          usage_error "--only: '$2' is not one of native, emulated"
        ONLY="$2"
        shift 2
        ;;
      --report)
        (($# >= 2)) && [[ -n "$2" ]] || usage_error "--report needs a file path"
        [[ -d "$(dirname -- "$2")" ]] || usage_error "--report: no folder for '$2'"
        REPORT="$2"
        shift 2
        ;;
      --lock)
        (($# >= 2)) || usage_error "--lock needs a file path"
        [[ -f "$2" ]] || usage_error "--lock: '$2' is not a file"
        LOCK="$(cd -- "$(dirname -- "$2")" && pwd)/$(basename -- "$2")"
        shift 2
        ;;
      -h | --help)
        sed -n '2,/^set -euo/p' "${SELF}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
      *) usage_error "unknown argument '$1' (allowed: --only native|emulated, --report PATH, --lock PATH)" ;;
    esac
  done
}

main() {
  if [[ "${1:-}" == __chroot ]]; then
    shift
    # exit, not return: the namespace side outlives edits of this file made during a run
    if [[ "${SPARKSERVE_AARCH64_PRIVATE_NS:-}" == 1 ]]; then
      inside_chroot "$@"
    else
      in_chroot "$@"
    fi
    exit 0
  fi
  parse_args "$@"
  if [[ "${ONLY}" != native ]] && ((EUID != 0)); then
    printf 'check_aarch64_stack.sh: the emulated check needs root (apt, chroot, mounts);' >&2
    printf ' --only native does not\n' >&2
    exit 1
  fi
  local base started_at
  started_at="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  base="$(cache_root)"
  mkdir -p "${base}"
  SCRATCH="$(mktemp -d "${base}/run.XXXXXX")"
  trap 'rm -rf "${SCRATCH}"' EXIT
  : >"${SCRATCH}/results.tsv"
  LOCK_NAME="${LOCK#"${REPO}/"}"
  LOCK_SHA="$(sha256sum "${LOCK}" | cut -d' ' -f1)"
  PIN_COUNT="$(python3 "${LIB}/aarch64_lock.py" pins "${LOCK}" | wc -l)"
  SUBSTITUTIONS=""
  progress "lock ${LOCK_NAME}: ${PIN_COUNT} pins, sha256 ${LOCK_SHA:0:16}; cache ${base}"
  if [[ "${ONLY}" != native ]]; then
    ensure_host_tools
  fi
  UV="$(ensure_uv "${base}")"
  export UV_CACHE_DIR="${base}/uv-cache"

  if [[ "${ONLY}" != emulated ]]; then
    run_check "native cp312 lock installs (hashes verified)" check_native "${SCRATCH}"
  fi
  if [[ "${ONLY}" != native ]]; then
    run_emulated "${base}"
  fi

  local failed passed
  passed="$(awk -F'\t' '$2 == "PASS"' "${SCRATCH}/results.tsv" | wc -l)"
  failed="$(awk -F'\t' '$2 != "PASS"' "${SCRATCH}/results.tsv" | wc -l)"
  if [[ -n "${REPORT}" ]]; then
    write_report "${REPORT}" "${started_at}"
    progress "report: ${REPORT}"
  fi
  if ((failed)); then
    printf 'SUMMARY: FAIL (%d passed, %d failed or not run) in %d s\n' "${passed}" "${failed}" \
      "${SECONDS}"
    exit 1
  fi
  printf 'SUMMARY: PASS (%d checks) in %d s\n' "${passed}" "${SECONDS}"
}

run_emulated() {
  local base="$1"
  local probes=("import torch" "import vllm" "import vllm.entrypoints.openai.api_server"
    "load vllm's compiled extensions")
  ROOTFS="${base}/rootfs-${SUITE}-arm64"
  write_cp311_lock "${SCRATCH}/cp311.lock" >"${SCRATCH}/substitutions.txt"
  SUBSTITUTIONS="$(cat "${SCRATCH}/substitutions.txt")"
  if [[ -n "${SUBSTITUTIONS}" ]]; then
    printf 'NOTE substituted for the cp311 chroot only: %s\n' "${SUBSTITUTIONS//$'\n'/; }"
  fi
  STACK="${base}/stack-cp${CHROOT_PYTHON/./}-$(key_of "${SCRATCH}/cp311.lock")"
  CUDA_STUB="${base}/cuda-stub-${STACK##*-}"
  local step
  for step in "arm64 ${SUITE} rootfs under qemu-user:ensure_rootfs" \
    "cp311 stack installs (hashes verified):ensure_stack" \
    "libcuda.so.1 stub for vllm's extensions:ensure_cuda_stub"; do
    run_check "${step%:*}" "${step##*:}" "${base}"
    if ((!CHECK_OK)); then
      skip_checks "${step%:*} failed" "${probes[@]}"
      return
    fi
  done
  run_check "${probes[0]}" probe_torch
  run_check "${probes[1]}" probe_vllm
  run_check "${probes[2]}" probe_api_server
  run_check "${probes[3]}" probe_extensions
}

main "$@"
