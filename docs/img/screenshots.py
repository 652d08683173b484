"""Makes the report screenshots in docs/img/ (run from the repository root; needs chromium).

    python docs/img/screenshots.py

Profile: two ranks under torchrun (gloo, CPU) training the demo transformer, rank 1 slower
in forward, a 200 ms stall injected in step 14's optimizer, steps 8-9 task-traced with
shapes. Compare: the synthetic MLP dumps of the tests, one with GELU's tanh approximation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

TRAIN = textwrap.dedent(
    """
    import sys, time, torch, torch.distributed as dist
    import opscope
    from opscope.demo.models import transformer_task
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt, batch = transformer_task(d=64, heads=4, layers=2, seq=32, batch=8)
    if rank == 1:
        model.register_forward_pre_hook(lambda m, a: time.sleep(0.004))
    model = torch.nn.parallel.DistributedDataParallel(model)
    with opscope.profile(sys.argv[1], steps="8-9", task_trace=True, record_shapes=True) as p:
        opt.register_step_pre_hook(lambda o, a, k: time.sleep(0.2) if p.steps.step == 14 else None)
        for i in range(24):
            x, y = batch(i)
            logits = model(x)
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
            p.step()
    dist.destroy_process_group()
    """
)


def shoot(page: Path, png: Path, height: int, fragment: str = "") -> None:
    chromium = shutil.which("chromium") or "chromium"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                        f"--user-data-dir={profile}", f"--window-size=1200,{height}", f"--screenshot={png}",
                        page.as_uri() + fragment], check=True, capture_output=True, timeout=120)
    from PIL import Image

    Image.open(png).convert("RGB").quantize(colors=128).save(png, optimize=True)  # small PNGs in git


def main() -> None:
    out = Path("docs/img")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "train.py").write_text(TRAIN)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(root / "train.py"),
                        str(root / "prof")], check=True, timeout=600)
        subprocess.run([sys.executable, "-m", "opscope", "profile", "show", str(root / "prof"), "--html",
                        str(root / "profile.html")], check=True)
        shoot(root / "profile.html", out / "profile_report.png", 2000, "#hover")
        sys.path.insert(0, "tests/unit/compare")
        import synth

        synth.mlp_run(root / "ref", steps=2)
        synth.mlp_run(root / "gelu", steps=2, fault="gelu_tanh")
        subprocess.run([sys.executable, "-m", "opscope", "compare", str(root / "gelu"), str(root / "ref"), "-o",
                        str(root / "cmp")], check=False)
        shoot(root / "cmp" / "report.html", out / "compare_report.png", 900, "#hover")


if __name__ == "__main__":
    main()
