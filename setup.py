"""The C kernels of deduplication (ito_assets/data/_kernels.c). Everything else about the package
is in pyproject.toml. The extension is optional: where no C compiler is found the install goes
on and `ito_assets.data.kernels` runs its numpy versions, which give the same numbers, slower."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ito_assets.data._kernels", ["ito_assets/data/_kernels.c"], extra_compile_args=["-O3"], optional=True)])
