"""pip install for weft's torch.distributed backend (weft_torch).

    pip install --no-build-isolation ./adapters/torch      # from a weft checkout

The extension is built by weft's own CMake build, not by setuptools' compiler
calls, so the flags, torch probing and pybind11 ABI tags live in one place
(adapters/torch/CMakeLists.txt). Where libweft comes from:

- WEFT_PREFIX set (an installed weft, `cmake --install --prefix P`):
  adapters/torch is configured as a project of its own, finds weft there
  (find_package(weft <this version>), weftConfig.cmake) and links it; the
  module's RPATH names that libweft.
- otherwise, from a checkout (this file two levels below weft's top
  CMakeLists.txt): weft's whole CMake project is configured with
  WEFT_BUILD_TESTS=OFF, only the targets weft and weft_torch are built, and
  libweft.so.0 is bundled into the package beside the module, whose RPATH
  is $ORIGIN. A user gets a working package without installing weft first.
- neither: find_package(weft) on CMake's default paths.

Environment: WEFT_PREFIX (above); WEFT_TORCH_BUILD_DIR, where setuptools
and CMake build (default: adapters/torch/build; kept, so a second install
rebuilds only what changed); WEFT_CMAKE_ARGS, extra CMake arguments (e.g.
"-DWEFT_WITH_CUDA=OFF"); CMAKE_BUILD_PARALLEL_LEVEL or MAX_JOBS, compile
jobs (default: the CPU count); CMAKE_GENERATOR, CC, CXX as CMake reads them.

The version is weft's (project(weft VERSION ...) in the checkout's
CMakeLists.txt, else WEFT_VERSION_* of the installed weft.h): the backend
is part of weft and is released with it, and find_package(weft <version>)
then refuses an installed weft of another minor version (its ABI may differ
before 1.0). See docs/torch.md, "Install with pip".
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CMAKE_MIN = (3, 18)


def fail(msg):
    # SystemExit with a string: printed to stderr, exit status 1; pip shows it.
    raise SystemExit("weft_torch setup.py: error: " + msg)


def checkout_root():
    """weft's source tree around this folder, or None (e.g. a copy of
    adapters/torch on its own)."""
    top = os.path.join(REPO, "CMakeLists.txt")
    if os.path.isfile(top) and os.path.isfile(os.path.join(REPO, "include", "weft.h")):
        with open(top) as f:
            if re.search(r"project\(\s*weft\b", f.read()):
                return REPO
    return None


def weft_version(root, prefix):
    if root:
        with open(os.path.join(root, "CMakeLists.txt")) as f:
            m = re.search(r"project\(\s*weft\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", f.read())
        if not m:
            fail("no 'project(weft VERSION x.y.z' in %s/CMakeLists.txt" % root)
        return m.group(1)
    for p in ([prefix] if prefix else []) + ["/usr/local", "/usr"]:
        h = os.path.join(p, "include", "weft.h")
        if os.path.isfile(h):
            with open(h) as f:
                text = f.read()
            parts = [re.search(r"#define\s+WEFT_VERSION_%s\s+([0-9]+)" % k, text) for k in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                return ".".join(m.group(1) for m in parts)
    fail("no weft source tree around %s and no installed weft.h%s: set WEFT_PREFIX to an installed weft "
         "(cmake --install --prefix ...) or install from a weft checkout" %
         (HERE, " under WEFT_PREFIX=" + prefix if prefix else " under /usr/local or /usr"))


def build_dir():
    d = os.path.abspath(os.environ.get("WEFT_TORCH_BUILD_DIR") or os.path.join(HERE, "build"))
    os.makedirs(d, exist_ok=True)
    return d


def check_tools():
    """Says exactly what is missing before CMake starts: cmake, the
    compilers, torch (with torch.distributed), Python's and pybind11's
    headers. Returns (cmake, pybind11 include dir)."""
    debian = "Debian: apt-get install "
    cmake = shutil.which(os.environ.get("CMAKE", "cmake"))
    if not cmake:
        if os.environ.get("CMAKE"):
            fail("CMAKE=%s: that cmake was not found" % os.environ["CMAKE"])
        fail("cmake was not found on PATH (%scmake; 3.18 or newer)" % debian)
    out = subprocess.run([cmake, "--version"], stdout=subprocess.PIPE, universal_newlines=True).stdout
    m = re.search(r"version\s+([0-9]+)\.([0-9]+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < CMAKE_MIN:
        fail("%s is %s; weft needs CMake %d.%d or newer" % (cmake, out.strip().splitlines()[0] if out else "?", *CMAKE_MIN))
    for var, names, what in (("CC", ("cc", "gcc", "clang"), "C"), ("CXX", ("c++", "g++", "clang++"), "C++")):
        if os.environ.get(var):
            if not shutil.which(shlex.split(os.environ[var])[0]):
                fail("%s=%s: that %s compiler was not found" % (var, os.environ[var], what))
        elif not any(shutil.which(n) for n in names):
            fail("no %s compiler (%s) on PATH (%sbuild-essential)" % (what, ", ".join(names), debian))
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        fail("this Python (%s) cannot import torch (%s). Build with --no-build-isolation in an environment "
             "that has torch (%spython3-torch libtorch-dev; a venv over it: python3 -m venv "
             "--system-site-packages)" % (sys.executable, e, debian))
    if not dist.is_available():
        fail("torch %s (%s) was built without torch.distributed" % (torch.__version__, torch.__file__))
    py_inc = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(py_inc, "Python.h")):
        fail("Python's headers (%s/Python.h) are missing (%spython3-dev)" % (py_inc, debian))
    # pybind11: the same places CMake looks (Python's include dir, /usr/include),
    # then the pybind11 module and torch's own copy (pip's torch 2.x ships one).
    cands = [py_inc, "/usr/include", "/usr/local/include"]
    try:
        import pybind11
        cands.append(pybind11.get_include())
    except ImportError:
        pass
    cands.append(os.path.join(os.path.dirname(torch.__file__), "include"))
    for d in cands:
        if os.path.isfile(os.path.join(d, "pybind11", "pybind11.h")):
            return cmake, d
    fail("pybind11's headers (pybind11/pybind11.h) were not found in %s (%spybind11-dev, or pip's pybind11)"
         % (", ".join(cands), debian))


class CMakeBuild(build_ext):
    """Builds weft_torch._C (and, from a checkout, libweft) with CMake and
    copies them where setuptools puts the extension."""

    def build_extension(self, ext):
        cmake, pybind11_inc = check_tools()
        root = checkout_root()
        prefix = os.environ.get("WEFT_PREFIX")
        version = self.distribution.get_version()
        bundled = root is not None and not prefix
        # One CMake tree per way in (their sources differ; a kept build dir may
        # have been used the other way before).
        cdir = os.path.join(build_dir(), "cmake" if bundled else "cmake-installed-weft")
        args = [cmake, "-S", root if bundled else HERE, "-B", cdir,
                "-DWEFT_WITH_TORCH=ON",
                "-DWEFT_TORCH_PYTHON=" + sys.executable,
                "-DWEFT_PYBIND11_INCLUDE_DIR=" + pybind11_inc]
        if bundled:
            # Only the library and the backend: no tests, no install rules used.
            # The copies bundled into the wheel carry their final RPATH from
            # the build on: libweft.so.0 the folders of what it links outside
            # the build (MPI's lib dir), with no padding or build-tree entry;
            # the module exactly $ORIGIN (its libweft.so.0 beside it).
            args += ["-DWEFT_BUILD_TESTS=OFF", "-DWEFT_TORCH_RPATH=$ORIGIN",
                     "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON"]
        else:
            # -U: search again, in case WEFT_PREFIX changed since the last build.
            args += ["-DWEFT_TORCH_WEFT_VERSION=" + version, "-Uweft_DIR"]
            if prefix:
                args.append("-DCMAKE_PREFIX_PATH=" + os.path.abspath(prefix))
        args += shlex.split(os.environ.get("WEFT_CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        how = ("libweft built from %s and bundled" % root) if bundled else \
              ("the installed weft%s" % (" under " + prefix if prefix else ""))
        print("weft_torch setup.py: weft %s, %s; CMake build in %s, %s jobs" % (version, how, cdir, jobs), flush=True)
        if bundled:
            hint = "weft also needs MPI (libopenmpi-dev) and hwloc (libhwloc-dev)"
        elif prefix:
            hint = ("WEFT_PREFIX=%s must be where weft %s was installed (cmake --install --prefix ...: "
                    "<prefix>/lib*/cmake/weft/weftConfig.cmake)" % (prefix, version))
        else:
            hint = "set WEFT_PREFIX to the prefix weft was installed to (cmake --install --prefix ...)"
        self._run(args, "configuring", hint)
        self._run([cmake, "--build", cdir, "--target", "weft_torch", "--parallel", jobs], "building", "")

        stage = os.path.join(cdir, "adapters", "torch", "weft_torch") if bundled else os.path.join(cdir, "weft_torch")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        module = os.path.join(stage, "_C" + suffix)
        if not os.path.isfile(module):
            fail("CMake built no %s" % module)
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(module, dest)
        shutil.copymode(module, dest)
        if bundled:
            # The module's DT_NEEDED is the soname; the file behind the symlink.
            lib = os.path.realpath(os.path.join(cdir, "libweft.so.0"))
            if not os.path.isfile(lib):
                fail("CMake built no %s" % os.path.join(cdir, "libweft.so.0"))
            shutil.copyfile(lib, os.path.join(os.path.dirname(dest), "libweft.so.0"))
            shutil.copymode(lib, os.path.join(os.path.dirname(dest), "libweft.so.0"))

    @staticmethod
    def _run(cmd, what, hint):
        print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            fail("CMake failed %s (exit status %d; its messages are above)%s" % (what, rc, "; " + hint if hint else ""))


# pip's metadata step (dist_info) and the wheel (bdist_wheel) need the wheel
# package; without it setuptools only says "invalid command 'bdist_wheel'".
if {"bdist_wheel", "dist_info"} & set(sys.argv):
    try:
        import wheel  # noqa: F401
    except ImportError:
        fail("the 'wheel' package is missing from this Python (%s): pip builds the wheel with it "
             "(Debian: apt-get install python3-wheel; --no-build-isolation uses the environment's own)"
             % sys.executable)

_root = checkout_root()
_bdir = build_dir()
setup(
    version=weft_version(_root, os.environ.get("WEFT_PREFIX")),
    # One extension, built by CMake (CMakeBuild): no sources for setuptools.
    packages=["weft_torch"],
    zip_safe=False,
    ext_modules=[Extension("weft_torch._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own output (build/, *.egg-info) goes to the build dir too,
    # so WEFT_TORCH_BUILD_DIR keeps the source tree clean.
    options={"build": {"build_base": _bdir}, "egg_info": {"egg_base": _bdir}},
)
