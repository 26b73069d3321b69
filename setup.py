"""Builds ftkit's compiled kernels (``ftkit.tensors._kernels``); everything else is in pyproject.toml.

``pip install -e .`` compiles the extension; in a checkout, ``python setup.py build_ext --inplace``
builds it next to its source. -O3 lets the compiler vectorise for the baseline of the target
(no -march=native: wheels and CI machines differ; on x86-64 the source itself adds AVX2
instances of its hot loops, picked at run time); -fno-trapping-math lets it turn float compares
into branch-free selects (no result changes); -ffp-contract=off keeps every float64 operation
rounded as numpy rounds it (no fused multiply-add), so tolerance counts agree exactly.
"""

from setuptools import Extension, setup

# GCC or Clang (the kernel uses their vector extensions); ftkit runs on Linux.
_FLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fno-strict-aliasing"]

setup(ext_modules=[Extension("ftkit.tensors._kernels", ["ftkit/tensors/_kernels.c"], extra_compile_args=_FLAGS)])
