#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh Debian machine, or says exactly what to install.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# bindgen (through redis-module) needs libclang at build time.
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libclang; then
  need+=(libclang-dev)
fi
# The tests' virtualenv: Debian's own python3 needs python3-venv for `python3 -m venv`.
if [ "${1:-}" = "--venv" ] && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
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
