#!/usr/bin/env bash
# Whether each patch compiles applied alone to HEAD, checked on this machine (no GPU needed)
# before a device call spends its start and a build on it: tools/device_ab.sh applies each
# of its patches to the tree by itself, so a patch that leans on another's change (a
# helper added in the other) fails there, after the minutes of the machine's start (the
# fifty-fourth session's first call).
#
#   bash tools/patch_compiles.sh a.patch b.patch
#
# For each patch: a detached worktree of HEAD with the patch applied; the CUDA files (.cu)
# the patch touches, and those that include a header it touches (directly or through other
# headers of csrc), each compiled for sm_90a to an object as the build does (nvcc -c -O3,
# the core's include paths: the host pass too, which parses device code and rejected a
# device-only intrinsic the -cubin compile of tools/sass_scan.py took, sixty-fourth
# session), as many at once as this machine has cores. Prints each file's
# result and exits nonzero if any patch fails to apply or to compile. C++ files (.cpp) are
# not compiled here: the device build still covers them.
set -uo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "no nvcc (set NVCC)" >&2; exit 2; }
[ $# -gt 0 ] || { echo "usage: bash tools/patch_compiles.sh PATCH [PATCH ...]" >&2; exit 2; }

# The .cu files under csrc that include any of the given headers (paths relative to csrc,
# as the sources' #include lines spell them), through any chain of csrc's own headers.
cuda_files_including() {
  local tree=$1; shift
  local -A seen=()
  local pending=("$@") header includer
  while [ ${#pending[@]} -gt 0 ]; do
    header=${pending[0]}; pending=("${pending[@]:1}")
    [ -n "${seen[$header]:-}" ] && continue
    seen[$header]=1
    while IFS= read -r includer; do
      includer=${includer#"$tree/csrc/"}
      case "$includer" in
        *.cu) echo "csrc/$includer" ;;
        *.cuh | *.h) pending+=("$includer") ;;
      esac
    done < <(grep -rlF "#include \"$header\"" "$tree/csrc" --include='*.cu' --include='*.cuh' --include='*.h')
  done
}

status=0
for patch in "$@"; do
  patch_path=$(realpath "$patch")
  tree=$(mktemp -d /tmp/patch_compiles.XXXXXX)
  git worktree add -q --detach "$tree" HEAD
  if ! git -C "$tree" apply "$patch_path"; then
    echo "== $patch: does not apply to HEAD"
    status=1
  else
    mapfile -t changed < <(git apply --numstat "$patch_path" | cut -f3)
    headers=() files=()
    for path in "${changed[@]}"; do
      case "$path" in
        csrc/*.cu) files+=("$path") ;;
        csrc/*.cuh | csrc/*.h) headers+=("${path#csrc/}") ;;
      esac
    done
    [ ${#headers[@]} -gt 0 ] && mapfile -t -O ${#files[@]} files < <(cuda_files_including "$tree" "${headers[@]}")
    mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u | grep .)
    echo "== $patch: ${#files[@]} CUDA files to compile"
    # one line a file: "ok <file>" or "FAILED <file>" and nvcc's first errors
    if ! printf '%s\n' "${files[@]}" | (cd "$tree" && xargs -r -P "$(nproc)" -I{} sh -c '
        log=$(mktemp); out=$(mktemp --suffix=.o); trap "rm -f $log $out" EXIT
        if "$0" -std=c++17 -arch=sm_90a -c -Xcompiler=-fPIC -O3 -Icsrc -Icsrc/include -DOPENTE_WITH_CUDA=1 -DOPENTE_WITH_CUDNN=0 \
            {} -o "$out" >"$log" 2>&1; then echo "ok {}"; else echo "FAILED {}"; grep -m5 error "$log"; exit 1; fi' \
        "$NVCC"); then
      status=1
    fi
  fi
  git worktree remove --force "$tree"
done
exit $status
