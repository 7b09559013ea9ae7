"""Builds moh_torch's compiled ops (_moh_ops.so) against the torch of the environment that runs pip, with the
toolkit's CMake build (python/CMakeLists.txt), and packages them:

    pip install ./python --no-build-isolation          # from the toolkit's checkout, into an env that has torch

MOH_BUILD_DIR=DIR (absolute, or relative to the checkout) builds in that existing CMake tree (configured with -DMOH_TORCH_OPS=ON against this torch, as
scripts/setup.sh configures build-torch2) instead of python/build/. The toolkit's apt packages (scripts/setup.sh)
must be installed; CUDA kernels are built in when this torch has CUDA and nvcc is found.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def fail(message):
    sys.exit(f"error: moh_torch build: {message}")


try:  # the ops are built against the torch of the environment that runs pip, never an isolated build env's
    import torch
except ImportError:
    fail("torch is not importable here: pip builds in an isolated environment without it by default (run `pip install "
         "./python --no-build-isolation` in the environment whose torch the ops are for)")

# The one torch the compiled ops work with (they call ATen outside its stable ABI): the wheel requires it exactly.
TORCH_RELEASE = torch.__version__.split("+")[0]


def cmake_tree():
    """The CMake tree to build in, configured against this interpreter's torch."""
    import torch

    torch_dir = os.path.join(torch.utils.cmake_prefix_path, "Torch")
    tree = os.environ.get("MOH_BUILD_DIR")
    if tree:
        tree = os.path.join(ROOT, tree)  # a relative path: from the checkout (pip builds from python/)
        cache = os.path.join(tree, "CMakeCache.txt")
        if not os.path.isfile(cache):
            fail(f"MOH_BUILD_DIR={tree}: no CMakeCache.txt (configure it first: MOH_LIBTORCH=pip bash scripts/setup.sh)")
        with open(cache) as f:
            entries = dict(re.match(r"([^:#]+):[A-Z]+=(.*)", line).groups() for line in f
                           if re.match(r"[^:#]+:[A-Z]+=", line))
        same_torch = os.path.realpath(entries.get("Torch_DIR", "")) == os.path.realpath(torch_dir)
        if entries.get("MOH_TORCH_OPS") not in ("ON", "1", "TRUE") or not same_torch:
            fail(f"MOH_BUILD_DIR={tree}: not configured with -DMOH_TORCH_OPS=ON against this torch ({torch_dir})")
        return tree
    tree = os.path.join(HERE, "build", f"torch-{torch.__version__}")
    subprocess.check_call(["cmake", "-S", ROOT, "-B", tree, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                           f"-DTorch_DIR={torch_dir}", "-DMOH_TORCH_OPS=ON", "-DMOH_BUILD_TESTS=OFF",
                           "-DMOH_BUILD_BENCH=OFF"])
    return tree


class BuildOps(build_py):
    def run(self):
        super().run()
        if not os.path.isfile(os.path.join(ROOT, "vision", "nn", "head_mix.h")):
            fail(f"{ROOT} is not the toolkit's checkout (moh_torch builds from it)")
        tree = cmake_tree()
        subprocess.check_call(["cmake", "--build", tree, "--target", "moh_torch_ops", "-j", str(os.cpu_count() or 2)])
        target = os.path.join(self.build_lib, "moh_torch")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(os.path.join(tree, "python", "_moh_ops.so"), os.path.join(target, "_moh_ops.so"))
        with open(os.path.join(target, "_build_info.py"), "w") as f:
            f.write(f"# written by setup.py: the torch _moh_ops.so was built against\n"
                    f"TORCH_VERSION = {torch.__version__!r}\nCUDA = {torch.version.cuda!r}\n")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildOps}, distclass=BinaryDistribution,
      install_requires=[f"torch=={TORCH_RELEASE}", "numpy"])
