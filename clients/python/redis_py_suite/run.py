"""Runs redis-py's own lock test suites against rlock: `python run.py [pytest args]`.

Fetches the pinned redis-py sdist (requirements.txt: version + sha256) with pip into a
cache directory, extracts its tests/test_lock.py and tests/test_asyncio/test_lock.py
unchanged into a suite directory, puts this harness's conftests beside them (a
module-loaded redis-server, redis-py's fixtures, rlock's Lock swapped in, excluded tests
skipped with their reason) and runs pytest on them. `make test-pyclient` calls it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TEST_FILES = ("tests/test_lock.py", "tests/test_asyncio/test_lock.py")
PYTEST_INI = """\
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings =
    error::pytest.PytestUnraisableExceptionWarning
markers =
    onlynoncluster: redis-py marker (the suite runs on one server)
    onlycluster: redis-py marker
"""


def pinned() -> tuple[str, str]:
    """(version, sha256) of redis in requirements.txt."""
    text = (HERE / "requirements.txt").read_text()
    m = re.search(r"^redis==(\S+)\s+--hash=sha256:([0-9a-f]{64})", text, re.M)
    if not m:
        sys.exit("redis_py_suite/requirements.txt: expected 'redis==X --hash=sha256:...'")
    return m.group(1), m.group(2)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_sdist(cache: Path) -> Path:
    """The pinned sdist in `cache`, downloaded by pip if missing; its hash checked."""
    version, digest = pinned()
    sdist = cache / f"redis-{version}.tar.gz"
    if not sdist.exists() or sha256(sdist) != digest:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", "--require-hashes",
                        "-r", str(HERE / "requirements.txt"), "-d", str(cache)], check=True)
    if sha256(sdist) != digest:
        sys.exit(f"{sdist}: sha256 differs from the pin in requirements.txt")
    return sdist


def build_suite(sdist: Path, suite: Path) -> None:
    """Lays out <suite>/tests: redis-py's two lock test files and this harness."""
    version, _ = pinned()
    shutil.rmtree(suite, ignore_errors=True)
    (suite / "tests" / "test_asyncio").mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        for name in TEST_FILES:
            member = tar.extractfile(f"redis-{version}/{name}")
            if member is None:
                sys.exit(f"{sdist} has no {name}")
            (suite / name).write_bytes(member.read())
    (suite / "tests" / "__init__.py").write_text("")
    (suite / "tests" / "test_asyncio" / "__init__.py").write_text("")
    shutil.copy(HERE / "conftest_root.py", suite / "tests" / "conftest.py")
    shutil.copy(HERE / "conftest_asyncio.py", suite / "tests" / "test_asyncio" / "conftest.py")
    shutil.copy(REPO / "tests" / "support" / "rlock_server.py", suite / "tests" / "rlock_server.py")
    (suite / "pytest.ini").write_text(PYTEST_INI)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=REPO / ".venv" / "cache",
                        help="where the sdist is kept (default .venv/cache)")
    parser.add_argument("--suite", type=Path, default=REPO / ".venv" / "redis-py-suite",
                        help="where the tests are laid out (default .venv/redis-py-suite)")
    args, pytest_args = parser.parse_known_args()
    build_suite(fetch_sdist(args.cache), args.suite)
    os.environ.setdefault("RLOCK_MODULE", str(REPO / "target" / "debug" / "librlock.so"))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c",
           str(args.suite / "pytest.ini"), "--rootdir", str(args.suite), "-rs",
           str(args.suite / "tests"), *pytest_args]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
