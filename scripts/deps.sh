#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh Debian machine, or says exactly
# what to install. Called by the Makefile before every build; cheap when all is there.
#
#   scripts/deps.sh                 build needs: redis-server, libclang (for bindgen)
#   scripts/deps.sh --venv          and what `python3 -m venv` needs (python3-venv)
#   scripts/deps.sh --valgrind      and valgrind (make bench-instr)
#   scripts/deps.sh --has-libclang [DIR...]
#                                   exit 0 when bindgen would find a libclang in DIRs
#                                   (default: the directories bindgen searches); the test
#                                   suite runs this against prepared directories.
set -euo pipefail

# The directories clang-sys (bindgen's loader) searches on Linux, in its order, after
# LIBCLANG_PATH and `llvm-config --libdir`.
default_libclang_dirs() {
  [ -n "${LIBCLANG_PATH:-}" ] && echo "$LIBCLANG_PATH"
  command -v llvm-config >/dev/null 2>&1 && llvm-config --libdir 2>/dev/null
  local pattern
  for pattern in '/usr/local/llvm*/lib*' '/usr/local/lib*/*/*' '/usr/local/lib*/*' '/usr/local/lib*' \
                 '/usr/lib*/*/*' '/usr/lib*/*' '/usr/lib*'; do
    # shellcheck disable=SC2086 # the glob is meant to expand
    compgen -G "$pattern" || true
  done
}

# True when one of the directories holds a file bindgen loads as libclang. With its
# `runtime` feature (redis-module's default) clang-sys accepts libclang.so, libclang-*.so,
# libclang.so.* and libclang-*.so.*, but never a name containing "-cpp." (libclang-cpp is
# the C++ library, which Debian installs with llvm; matching it was the old bug here).
has_libclang() {
  local dir f name
  for dir in "$@"; do
    [ -d "$dir" ] || continue
    for f in "$dir"/libclang.so "$dir"/libclang-*.so "$dir"/libclang.so.* "$dir"/libclang-*.so.*; do
      [ -e "$f" ] || continue
      name=${f##*/}
      case "$name" in *-cpp.*) continue ;; esac
      return 0
    done
  done
  return 1
}

if [ "${1:-}" = "--has-libclang" ]; then
  shift
  if [ $# -eq 0 ]; then
    mapfile -t dirs < <(default_libclang_dirs)
    set -- "${dirs[@]}"
  fi
  has_libclang "$@"
  exit
fi

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# bindgen (through redis-module) loads libclang at build time, and needs clang's own
# headers (stddef.h...) beside it: Debian's libclang-dev brings both.
mapfile -t dirs < <(default_libclang_dirs)
if ! has_libclang "${dirs[@]}" || ! compgen -G '/usr/lib/llvm-*/lib/clang/*/include/stddef.h' >/dev/null; then
  need+=(libclang-dev)
fi
for arg in "$@"; do
  case "$arg" in
    # The tests' virtualenv: Debian's own python3 needs python3-venv for `python3 -m venv`.
    --venv) python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv) ;;
    --valgrind) command -v valgrind >/dev/null 2>&1 || need+=(valgrind) ;;
  esac
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps: installing ${need[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # The Debian package may start a system redis on 6379; the tests use their own free ports,
  # so it is harmless, but stop it so nothing outlives the set-up.
  (command -v service >/dev/null && service redis-server stop >/dev/null 2>&1) || true
else
  echo "deps: missing ${need[*]}. Install them, e.g.: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
