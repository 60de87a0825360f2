"""The one compiled part: the Kineto chunk scanner (src/tracestory/ingest/_kineto_scan.c).

Optional: where no C compiler is at hand the install still succeeds and the reader uses its
msgspec path (tracestory.ingest.kineto_native says which one runs). Everything else is in
pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tracestory.ingest._kineto_scan",
            ["src/tracestory/ingest/_kineto_scan.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
