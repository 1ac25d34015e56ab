#!/usr/bin/env bash
# Kernel changes against the tree, on the lent GPU machine, in one call: the tree as it is
# ("base") and the tree with each patch applied, each built (the first from clean, the
# others by incremental rebuilds of the files a patch touches) and installed into its own
# directory; CHECK (a command, e.g. the tests of the kernels a patch changes) runs under
# each patched build while its patch is applied (so tests the patch adds run too); then
# the benchmark command runs under every build in turn, ROUNDS times, so each variant's
# times come from the same machine and the same minutes as the others'.
# CHECK_LAST=1 runs CHECK under the last patch's build only (where each patch includes the
# ones before it, its tests cover theirs). CHECK_LINES: how many of CHECK's last output
# lines are kept (5; more for a new kernel whose failures are to be read).
# Every output line of a command is prefixed with its variant's name: [base], [x.patch];
# tools/ab_summary.py puts the bandwidth benchmarks' times side by side from that output.
#
#   bash tools/device_ab.sh benchmarks/candidates/x.patch -- python3 benchmarks/bench_norm.py --ops bwd
#   CHECK="pytest -q tests/python/test_normalization.py -k 'bwd and cuda'" ROUNDS=3 \
#     bash tools/device_ab.sh a.patch b.patch -- python3 benchmarks/bench_norm.py --shapes 8192x5120
#
# Patches are `git diff` output against the tree (applied with git apply, which needs no
# repository, or patch -p1), each applied alone: tools/patch_compiles.sh checks on a
# machine without a GPU that each compiles so, before a call. Commands run from the
# repository root, as device_check.sh's do, with the variant's install directory first on
# PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
CHECK=${CHECK:-}
CHECK_LAST=${CHECK_LAST:-}
CHECK_LINES=${CHECK_LINES:-5}
AB=${AB_DIR:-/tmp/opente_ab}

patches=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patches+=("$1"); shift; done
if [ $# -lt 2 ] || [ ${#patches[@]} -eq 0 ]; then
  echo "usage: bash tools/device_ab.sh PATCH [PATCH ...] -- COMMAND [ARGS ...]" >&2
  exit 2
fi
shift  # the --

# git apply (no repository needed), or patch(1) where git is missing; $1: --check, -R or
# nothing, $2: the patch.
apply_patch() {
  if command -v git >/dev/null; then
    git apply ${1:+"$1"} "$2"
  else
    case "$1" in
      --check) patch -s -p1 --dry-run <"$2" ;;
      -R) patch -s -p1 -R <"$2" ;;
      *) patch -s -p1 <"$2" ;;
    esac
  fi
}
for patch in "${patches[@]}"; do
  apply_patch --check "$patch" || { echo "$patch does not apply to this tree" >&2; exit 2; }
done

export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) PYTHONUNBUFFERED=1
rm -rf "$AB" build/ab
mkdir -p "$AB"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

# Builds the tree as it stands now into $AB/<name>.
install_variant() {
  local name=$1
  SECONDS=0
  if ! python3 -m pip install --no-build-isolation --no-deps -q . -C build-dir=build/ab --target "$AB/$name" \
      >"$AB/$name.build.log" 2>&1; then
    echo "== build of $name failed:"; tail -30 "$AB/$name.build.log"; exit 1
  fi
  echo "== $name built in ${SECONDS} s"
}

# Runs "$@" under variant $1's build, each output line prefixed with [variant].
under() {
  local name=$1; shift
  PYTHONPATH="$AB/$name${PYTHONPATH:+:$PYTHONPATH}" "$@" 2>&1 | sed "s|^|[$name] |"
}

variants=(base)
install_variant base
for patch in "${patches[@]}"; do
  name=$(basename "$patch")
  apply_patch "" "$patch"
  install_variant "$name"
  if [ -n "$CHECK" ] && { [ -z "$CHECK_LAST" ] || [ "$patch" = "${patches[-1]}" ]; }; then
    under "$name" bash -c "$CHECK" | tail -"$CHECK_LINES"
  fi
  apply_patch -R "$patch"
  variants+=("$name")
done

for round in $(seq "$ROUNDS"); do
  echo "== round $round"
  for name in "${variants[@]}"; do under "$name" "$@"; done
done
