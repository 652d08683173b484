"""Where the time of a dumped step goes: the training thread's CPU samples (Linux ``perf``,
software clock) of a bare and a dumped run of the same steps, grouped by what the code does.

Each run is its own process; ``perf record -p`` samples only its loop (model built and the
native module loaded before). The training thread's samples per step, dumped minus bare, per
group, are printed in microseconds; the other threads (the statistics worker, the writer)
are printed as a whole. A group's share of a torch kernel's time that grows under the dump
(its data pushed out of the caches by the dump's own reads) shows as "torch kernels".

    python benchmarks/profile_dump.py [--steps 30] [--level aten] [--tiny | --task mlp]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

_NATIVE = r"_opscope_dump"
GROUPS = [  # (name, dso pattern, symbol pattern): the first match wins
    ("statistics kernel (one read of each new tensor)", _NATIVE, r"hash_|stats_|_fused|_loop|^run$|^s_"),
    ("observer callbacks, op kinds", _NATIVE, r"on_start|on_end|kind_of|engine_record|tracing|own"),
    ("argument walks, JSON of non-tensor arguments", _NATIVE + r"|libc",
     r"args_of|json|flatten|dtype_name|printf|strlen"),
    ("data-flow lookups, rows", _NATIVE, r"Hashtable|flow|same_tensor|geometry|shared_key|_row|measure|param_of|"
                                         r"intern|selected|before_op|on_op|finish_row|Elems|hash<|submit|wait"),
    ("step boundary (rows taken, step cleared)", _NATIVE, r"take_columns|clear_step|resolve_links|Strings|py_"),
    ("other native dump code", _NATIVE, r""),
    ("RecordFunction (torch: boxing arguments, callbacks)", r"libtorch|libc10",
     r"RecordFunction|CallbackManager|IValue|getOutputs|CaptureKernelCall|rebuild_scope"),
    ("malloc / free", r"libc", r"malloc|free|_int_|unlink_chunk|consolidate"),
    ("Python (module hooks, step boundary, optimizer hooks)", r"libpython|JIT|libtorch_python", r""),
    ("torch kernels (cache effects, copies)", r"libtorch|libc10|libgomp", r""),
    ("system (scheduling, page faults, futexes)", r"kernel", r""),
    ("other", r"", r""),
]

CHILD = r"""
import contextlib, os, sys, time, signal, subprocess, warnings, torch
import opscope
from opscope.demo.models import mlp_task, train_step, transformer_task
torch.set_num_threads(1); warnings.filterwarnings("ignore")
mode, n, level, task, out, root = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], *sys.argv[5:7]
model, opt, batch = {"tiny": lambda: mlp_task(batch=16, d_in=32, hidden=32, depth=2),
                     "mlp": lambda: mlp_task(batch=256, d_in=512, hidden=512, depth=3),
                     "transformer": transformer_task}[task]()
def loop(k, d=None):
    for i in range(k):
        train_step(model, opt, *batch(i))
        if d is not None: d.step()
# the dump starts before and stops after the sampled loop: its start and stop (the manifest, the
# writer's last flush) are no part of a step
with (opscope.dump(root, level=level, overwrite=True) if mode == "dump" else contextlib.nullcontext()) as d:
    loop(3, d)
    perf = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "4000", "-o", out, "-p", str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    loop(n, d)
    perf.send_signal(signal.SIGINT); perf.wait()
print(os.getpid())
"""


def _samples(path: str, tid: int | None) -> collections.Counter:
    # sorted by thread and filtered here: ``perf report --tid`` dropped about a quarter of the
    # thread's samples here (perf 6.x; libpython's among them, which made the dumped step's
    # Python read less than the bare one's)
    cmd = ["perf", "report", "-i", path, "--no-children", "--sort", "pid,dso,sym", "-n", "-q",
           "-F", "sample,pid,dso,sym"]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    found: collections.Counter = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+(\d+):\S*\s+(\S+)\s+\[.\]\s+(.*)", line)
        if m and (tid is None or int(m.group(2)) == tid):
            dso, sym = m.group(3), m.group(4)
            name = next(g for g, d, s in GROUPS if re.search(d, dso) and re.search(s, sym))
            found[name] += int(m.group(1))
    return found


def _run(mode: str, args: argparse.Namespace, tmp: str) -> tuple[str, int]:
    out = os.path.join(tmp, f"{mode}.data")
    task = "tiny" if args.tiny else args.task
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.steps), args.level, task, out,
                           os.path.join(tmp, "dump")], capture_output=True, text=True, check=True)
    return out, int(proc.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--level", default="aten")
    parser.add_argument("--tiny", action="store_true", help="the tiny MLP step (~0.5 ms) instead of the transformer")
    parser.add_argument("--task", choices=("transformer", "mlp"), default="transformer",
                        help="bench_dump.py's transformer or MLP step")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (apt-get install linux-perf, or linux-tools-$(uname -r))")
    rate = 4000 * args.steps / 1e6  # samples per microsecond of one step
    with tempfile.TemporaryDirectory() as tmp:
        bare, bare_pid = _run("bare", args, tmp)
        dumped, pid = _run("dump", args, tmp)
        b, c, whole = _samples(bare, bare_pid), _samples(dumped, pid), _samples(dumped, None)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f}: training thread "
          f"{sum(b.values()) / rate / 1e3:.2f} ms/step bare, {sum(c.values()) / rate / 1e3:.2f} ms/step dumped")
    for name, _, _ in GROUPS:
        print(f"{(c[name] - b[name]) / rate:8.0f} us  {name}")
    print(f"{(sum(whole.values()) - sum(c.values())) / rate:8.0f} us  other threads (statistics worker, writer)")


if __name__ == "__main__":
    main()
