"""Build a C++ extension at run time, once, however many processes ask at the same moment.

Introduced in notebooks/04_custom_backend.ipynb (the ``labkit_cpp`` backend).

``labkit.backends.cpp`` compiles its backend with ``torch.utils.cpp_extension.load`` the first
time it is imported. This module holds what that needs and can be imported without a compiler
(and without importing torch): ``available()`` says whether the build can run here, and
``load_locked()`` runs it under an exclusive file lock, so that N ranks importing the backend
at once compile it once — the first takes the lock and compiles, the others wait and then load
the cached library.

Why a lock of our own on top of cpp_extension's ``FileBaton``: the baton is a plain file that
a killed process (a rank stopped by a timeout mid-build) leaves behind, after which every
later build waits for ever. ``fcntl.flock`` is released by the kernel when its holder dies,
and a baton found while holding it can only be such a leftover, so it is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

__all__ = ["BuildInfo", "MISSING_COMPILER", "available", "find_compiler", "load_locked"]

MISSING_COMPILER = (
    "labkit_cpp needs a C++ compiler (g++ or clang++) to build its backend at run time, and "
    "{found}. To install one: build-essential on Debian/Ubuntu (sudo apt-get install "
    "build-essential), Xcode CLT on macOS (xcode-select --install), or cxx-compiler with conda "
    "(conda install -c conda-forge cxx-compiler); or set CXX to a compiler's path. Until then "
    "use another backend, e.g. backend='gloo'."
)
MISSING_NINJA = (
    "labkit_cpp needs ninja to build its backend (torch.utils.cpp_extension drives the build "
    "with it), and none was found: pip install ninja (requirements.txt pins it)."
)
# What a build log says when the compiler it ran does not exist.
_NO_COMPILER_SIGNS = ("command not found", ": not found", "No such file or directory: 'c++'")


def find_compiler() -> str | None:
    """The C++ compiler cpp_extension will run: ``$CXX`` if set, else c++, g++ or clang++.

    Returns:
        The compiler's full path, or None when there is none on PATH.
    """
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _missing_compiler_message() -> str:
    cxx = os.environ.get("CXX")
    found = f"CXX={cxx!r} is not an executable" if cxx else "none of c++, g++, clang++ is on PATH"
    return MISSING_COMPILER.format(found=found)


def _ninja_dir() -> str | None:
    """Directory holding ninja: on PATH, or the pip package's (a venv that is not activated)."""
    path = shutil.which("ninja")
    if path:
        return os.path.dirname(path)
    try:
        import ninja

        candidate = getattr(ninja, "BIN_DIR", None)
    except ImportError:
        return None
    if candidate and os.path.exists(os.path.join(candidate, "ninja")):
        return candidate
    return None


def available() -> tuple[bool, str]:
    """Whether ``labkit_cpp`` can be built here, without building it or raising.

    Returns:
        ``(True, "compiler /usr/bin/c++, ninja in /usr/bin")`` when a C++ compiler and ninja
        are found; else ``(False, message)`` with the message importing
        ``labkit.backends.cpp`` raises (what is missing and how to install it).
    """
    compiler = find_compiler()
    if compiler is None:
        return False, _missing_compiler_message()
    ninja_dir = _ninja_dir()
    if ninja_dir is None:
        return False, MISSING_NINJA
    return True, f"compiler {compiler}, ninja in {ninja_dir}"


@dataclass(frozen=True)
class BuildInfo:
    """What ``load_locked`` did in this process."""

    name: str
    library: str  # path of the shared library that was loaded
    compiled: bool  # False when the cached library was up to date
    seconds: float  # wall time of the build (or of the up-to-date check) and the load
    waited_s: float  # time spent waiting for another process's build (the lock)


@contextlib.contextmanager
def _build_env(compiler: str, ninja_dir: str) -> Iterator[None]:
    """Point cpp_extension at the compiler and ninja we found (it runs ``$CXX`` or c++)."""
    saved = {k: os.environ.get(k) for k in ("CXX", "PATH")}
    if not os.environ.get("CXX") and shutil.which("c++") is None:
        os.environ["CXX"] = compiler
    if shutil.which("ninja") is None:
        os.environ["PATH"] = ninja_dir + os.pathsep + os.environ.get("PATH", "")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _exclusive(lock_path: str, note_after_s: float = 2.0) -> Iterator[float]:
    """Hold an exclusive lock on ``lock_path``; yields the seconds spent waiting for it.

    A wait longer than ``note_after_s`` (another process is compiling) is announced once on
    stderr, so a rank that sits still for a minute says why.
    """
    start = time.perf_counter()
    try:
        import fcntl
    except ImportError:  # Windows: rely on cpp_extension's own baton
        yield 0.0
        return
    with open(lock_path, "a+b") as f:
        announced = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not announced and time.perf_counter() - start > note_after_s:
                    _note(f"waiting for another process to finish building ({lock_path})")
                    announced = True
                time.sleep(0.05)
        try:
            yield time.perf_counter() - start
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _note(text: str) -> None:
    print(f"labkit_cpp: {text}", file=sys.stderr, flush=True)


def _library_path(build_dir: str, name: str) -> str:
    import sysconfig

    suffix = ".pyd" if sys.platform == "win32" else ".so"
    candidates = [os.path.join(build_dir, name + suffix)]
    ext_suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if ext_suffix:
        candidates.append(os.path.join(build_dir, name + ext_suffix))
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def load_locked(
    name: str, sources: list[str], verbose: bool = False
) -> tuple[ModuleType, BuildInfo]:
    """Build (if needed) and import a C++ extension, one process at a time.

    Calls ``torch.utils.cpp_extension.load(name=..., sources=...)``, which caches the build
    in torch's default extensions directory (``$TORCH_EXTENSIONS_DIR`` if set) and rebuilds
    only when a source or a flag changed, under an exclusive lock on
    ``<build dir>/labkit_build.lock``.

    Args:
        name: the extension's module name (also its build directory's name).
        sources: C++ source files.
        verbose: show cpp_extension's build log.

    Returns:
        The imported extension module, and a ``BuildInfo`` saying whether it was compiled and
        how long that took.

    Raises:
        RuntimeError: no C++ compiler (``MISSING_COMPILER``), no ninja, or the build failed
            (the compiler's output is in the message).
    """
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    compiler, ninja_dir = find_compiler(), _ninja_dir()
    assert compiler is not None and ninja_dir is not None  # noqa: S101 - available() said so

    from torch.utils import cpp_extension

    # The directory load() itself uses; private in torch, so fall back to its documented rule.
    try:
        build_dir = cpp_extension._get_build_directory(name, verbose=False)
    except AttributeError:  # pragma: no cover - other torch versions
        root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
        build_dir = os.path.join(root, name)
        os.makedirs(build_dir, exist_ok=True)
    library = _library_path(build_dir, name)
    with (
        _build_env(compiler, ninja_dir),
        _exclusive(os.path.join(build_dir, "labkit_build.lock")) as waited,
    ):
        baton = os.path.join(build_dir, "lock")
        if os.path.exists(baton):  # we hold the lock: nobody is building, it is a leftover
            os.remove(baton)
        before = _mtime(library)
        newest_source = max((_mtime(src) or 0.0) for src in sources)
        if before is None or before < newest_source:
            _note(f"compiling {name} (once; 25-60 s on a 2-core laptop)...")
        start = time.perf_counter()
        try:
            module = cpp_extension.load(name=name, sources=sources, verbose=verbose)
        except Exception as exc:
            text = str(exc)
            if find_compiler() is None or any(s in text for s in _NO_COMPILER_SIGNS):
                raise RuntimeError(_missing_compiler_message()) from exc
            raise RuntimeError(
                f"building the C++ extension {name!r} failed (compiler {compiler}, build "
                f"directory {build_dir}): {text}"
            ) from exc
        seconds = time.perf_counter() - start
    library = getattr(module, "__file__", None) or _library_path(build_dir, name)
    compiled = before is None or _mtime(library) != before
    return module, BuildInfo(name, library, compiled, seconds, waited)
