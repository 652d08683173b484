"""Build the optional one-pass statistics kernel. Without a C compiler opscope still works
(statistics then use torch reductions, several passes instead of one).

Also installs ``opscope-autostart.pth`` next to the package (regular and editable installs):
at interpreter startup it imports ``opscope.autostart`` only when ``OPSCOPE_CONFIG`` is set,
so ``OPSCOPE_CONFIG=config.json python train.py`` works without ``opscope run``.
"""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH_NAME = "opscope-autostart.pth"
# One line; site.py executes lines that start with "import". The environment check comes
# first so that a process without OPSCOPE_CONFIG pays for nothing but it.
PTH_LINE = ('import os; os.environ.get("OPSCOPE_CONFIG") and '
            '__import__("opscope.autostart").autostart.activate(".pth")\n')


class BuildPyWithPth(build_py):
    """Puts the .pth at the root of the build, so wheels install it into site-packages."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            target = Path(self.build_lib, PTH_NAME)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(PTH_LINE, encoding="utf-8")

    def get_outputs(self, *args, **kwargs):
        outputs = super().get_outputs(*args, **kwargs)
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, str(Path(self.build_lib, PTH_NAME))]


cmdclass = {"build_py": BuildPyWithPth}

try:  # setuptools >= 64: PEP 660 editable installs (pip install -e .)
    from setuptools.command.editable_wheel import editable_wheel

    class EditableWheelWithPth(editable_wheel):
        """Adds the .pth to the editable wheel too (its build folder is not installed)."""

        def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
            result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
            Path(unpacked_wheel, PTH_NAME).write_text(PTH_LINE, encoding="utf-8")
            return result

    cmdclass["editable_wheel"] = EditableWheelWithPth
except ImportError:
    pass

setup(
    cmdclass=cmdclass,
    ext_modules=[  # src/opscope/_c: headers shared by the kernels (opscope_half.h)
        Extension(
            "opscope.capture.torch.native._fastats",
            sources=["src/opscope/capture/torch/native/_c/fastats.c"],
            depends=["src/opscope/capture/torch/native/_c/fastats_avx2.h", "src/opscope/capture/torch/native/_c/fastats_kernel.h",
                     "src/opscope/capture/torch/native/_c/fastats_fused.h", "src/opscope/capture/torch/native/_c/fastats_avx512.h",
                     "src/opscope/capture/torch/native/_c/fastats_spread.h",
                     "src/opscope/capture/torch/native/_c/fastats_transposed.h",
                     "src/opscope/capture/torch/native/_c/fastats_worker.h",
                     "src/opscope/_c/opscope_half.h"],
            include_dirs=["src/opscope/_c"],
            extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-std=c99", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        Extension(  # compare's one-pass kernel over a block of a tensor pair (opscope.compare.kernel)
            "opscope.compare._pairsums",
            sources=["src/opscope/compare/_c/pairsums.c"],
            extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-std=c99"],
            optional=True,
        ),
        Extension(  # the monitor's batched norms (src/opscope/monitor/_c/monstats.c)
            "opscope.monitor._monstats",
            sources=["src/opscope/monitor/_c/monstats.c", "src/opscope/monitor/_c/band.c"],
            depends=["src/opscope/_c/opscope_half.h", "src/opscope/monitor/_c/band.h"],
            include_dirs=["src/opscope/_c"],
            extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
    ]
)
