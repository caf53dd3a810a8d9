#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh Debian machine, or says exactly
# what to install. Called by the Makefile before every build; cheap when all is there.
#
#   scripts/deps.sh                 build needs: redis-server, libclang (for bindgen)
#   scripts/deps.sh --venv          and what `python3 -m venv` needs (python3-venv)
#   scripts/deps.sh --valgrind      and valgrind (make bench-instr)
#   scripts/deps.sh --java          and a JDK 17 and Maven (make test-java, bench-java)
#   scripts/deps.sh --faults        and the fault harness's needs (make faults, test-faults):
#                                   iproute2 (ip netns, tc) and Go (golang-go, for the
#                                   Porcupine checker) when `go` is missing
#   scripts/deps.sh --go            and Go >= 1.21 for the Go client (make test-go, bench-go):
#                                   `go` on PATH or /usr/local/go; Debian 12's golang-go
#                                   (1.19) is too old for go-redis v9, so a missing or older
#                                   Go is named, not installed
#   scripts/deps.sh --has-libclang [DIR...]
#                                   exit 0 when bindgen would find a libclang in DIRs
#                                   (default: where bindgen searches); tests/server/test_setup.py
#                                   runs this against prepared directories.
set -euo pipefail

# Where clang-sys (bindgen's loader) looks on Linux, in its order (clang-sys 1.x,
# build/common.rs): only $LIBCLANG_PATH when it is set (a directory, or the library file
# itself); else `llvm-config --prefix`'s bin, lib and lib64, $LD_LIBRARY_PATH,
# $LIBRARY_PATH, then these globs of directories.
default_libclang_dirs() {
  if [ -n "${LIBCLANG_PATH:-}" ]; then
    echo "$LIBCLANG_PATH"
    return
  fi
  local prefix pattern
  if prefix=$(llvm-config --prefix 2>/dev/null); then
    printf '%s\n' "$prefix/bin" "$prefix/lib" "$prefix/lib64"
  fi
  # Empty entries are skipped: they name no directory.
  tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep . || true
  tr ':' '\n' <<<"${LIBRARY_PATH:-}" | grep . || true
  for pattern in '/usr/local/llvm*/lib*' '/usr/local/lib*/*/*' '/usr/local/lib*/*' '/usr/local/lib*' \
                 '/usr/lib*/*/*' '/usr/lib*/*' '/usr/lib*'; do
    # shellcheck disable=SC2086 # the glob is meant to expand
    compgen -G "$pattern" || true
  done
}

# True when the file is a 64-bit ELF object: clang-sys skips any other match (a 32-bit
# library, a stub, a dangling link) as invalid.
is_elf64() {
  [ -f "$1" ] && [ "$(LC_ALL=C head -c 5 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c4602 ]
}

# True when the name is one clang-sys loads as libclang. With its `runtime` feature
# (redis-module's default) that is libclang.so, libclang-*.so, libclang.so.* and
# libclang-*.so.*, but never a name containing "-cpp." (libclang-cpp is the C++ library,
# which Debian installs with llvm; matching it was the old bug here).
is_libclang_name() {
  case "$1" in *-cpp.*) return 1 ;; esac
  case "$1" in libclang.so | libclang-*.so | libclang.so.* | libclang-*.so.*) return 0 ;; esac
  return 1
}

# True when one of the arguments (directories, or library files as $LIBCLANG_PATH may
# name) holds a file bindgen would load as libclang.
has_libclang() {
  local arg f
  for arg in "$@"; do
    if [ -f "$arg" ] && is_libclang_name "${arg##*/}" && is_elf64 "$arg"; then
      return 0
    fi
    [ -d "$arg" ] || continue
    for f in "$arg"/libclang*.so*; do
      if is_libclang_name "${f##*/}" && is_elf64 "$f"; then
        return 0
      fi
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
if [ -n "${LIBCLANG_PATH:-}" ] && ! has_libclang "${dirs[@]}"; then
  # bindgen looks nowhere else then, so installing a package would not help.
  echo "deps: LIBCLANG_PATH=$LIBCLANG_PATH holds no libclang bindgen can load; unset it or fix it" >&2
  exit 1
fi
if ! has_libclang "${dirs[@]}" || ! compgen -G '/usr/lib/llvm-*/lib/clang/*/include/stddef.h' >/dev/null; then
  need+=(libclang-dev)
fi
for arg in "$@"; do
  case "$arg" in
    # The tests' virtualenv: Debian's own python3 needs python3-venv for `python3 -m venv`.
    --venv) python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv) ;;
    --valgrind) command -v valgrind >/dev/null 2>&1 || need+=(valgrind) ;;
    # The Java client (clients/java): javac, not only a JRE; Maven fetches the rest.
    --java)
      command -v javac >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
      command -v mvn >/dev/null 2>&1 || need+=(maven)
      ;;
    --go)
      gobin=$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)
      gover=$("$gobin" env GOVERSION 2>/dev/null || true)   # go1.26.8
      minor=$(sed -E 's/^go1\.([0-9]+).*/\1/;t;d' <<<"$gover")
      if [ -z "$minor" ] || [ "$minor" -lt 21 ]; then
        echo "deps: the Go client needs Go >= 1.21 (found: ${gover:-none}); install it from" \
          "https://go.dev/dl (into /usr/local/go) or Debian's bookworm-backports golang-1.22-go" >&2
        exit 1
      fi
      ;;
    --faults)
      { command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; } || need+=(iproute2)
      command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || need+=(golang-go)
      ;;
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
