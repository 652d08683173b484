"""Build the optional one-pass statistics kernel. Without a C compiler opscope still works
(statistics then use torch reductions, several passes instead of one)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "opscope.capture.torch._fastats",
            sources=["src/opscope/capture/torch/_c/fastats.c"],
            extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-std=c99", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
