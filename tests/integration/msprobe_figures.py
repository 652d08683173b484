"""The figures of docs/peer-dumps.md: opscope's verdict against ``msprobe compare`` on the same
pairs of real msprobe dumps (written by msprobe_runs.py), one line per pair.

    python tests/integration/msprobe_figures.py WORKDIR   # dumps, then both tools' verdicts

msprobe compare is given the step folders (``-tp TARGET/step0 -gp GOLDEN/step0``), step 0
only; opscope compares the whole dumps (steps 0 and 1) and names its first divergence.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
CASES = {
    "ref": [], "same": [], "act": ["--fault", "act"], "weight": ["--fault", "weight"], "insert": ["--insert"],
    "bf16": ["--bf16"], "t_ref": ["--task", "tensor"], "t_same": ["--task", "tensor"],
    "t_act": ["--task", "tensor", "--fault", "act"], "t_insert": ["--task", "tensor", "--insert"],
    "t_bf16": ["--task", "tensor", "--bf16"], "ops": ["--tool", "opscope"],
    "g_ref": ["--model", "gpt2"], "g_same": ["--model", "gpt2"], "g_act": ["--model", "gpt2", "--fault", "act"],
    "g_bf16": ["--model", "gpt2", "--bf16"], "g_ops": ["--model", "gpt2", "--tool", "opscope"],
}
PAIRS = [("same", "ref"), ("bf16", "ref"), ("act", "ref"), ("weight", "ref"), ("insert", "ref"),
         ("t_same", "t_ref"), ("t_bf16", "t_ref"), ("t_act", "t_ref"), ("t_insert", "t_ref"),
         ("g_same", "g_ref"), ("g_bf16", "g_ref"), ("g_act", "g_ref"),
         ("ref", "ops"), ("bf16", "ops"), ("act", "ops"),  # msprobe against opscope
         ("g_ref", "g_ops"), ("g_bf16", "g_ops"), ("g_act", "g_ops")]


def msprobe_verdict(work: Path, target: str, golden: str) -> str:
    out = work / f"msprobe_{target}"
    subprocess.run([str(Path(sys.executable).with_name("msprobe")), "compare", "-tp", str(work / target / "step0"),
                    "-gp", str(work / golden / "step0"), "-o", str(out)], capture_output=True, timeout=600, check=True)
    with open(next(out.glob("compare_result_*.csv")), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    flagged = [r for r in rows if r["Result"].lower() not in ("pass", "")]
    counts = {k: sum(r["Result"].lower() == k for r in rows) for k in ("pass", "warning", "error")}
    first = (f"{flagged[0]['NPU Name']} ({flagged[0]['Result']})" if flagged else "-")
    unmatched = sum(1 for r in rows if r["Bench Name"] in ("N/A", "", "None"))
    return (f"{counts['pass']} pass / {counts['warning']} warning / {counts['error']} error; "
            f"{unmatched} unmatched; first flagged {first}")


def opscope_verdict(work: Path, target: str, golden: str) -> str:
    import opscope

    r = opscope.compare(work / target, work / golden, workers=1)
    first = r.first_divergence
    named = (f"{first.kind} {first.module or '(top level)'} / {first.op} "
             f"({first.phase}, step {first.step}, call {first.call})") if first else "-"
    return f"{r.verdict}; {r.counts['pairs']} pairs, {r.counts['failed']} failed, " \
           f"{r.counts['unpaired_target'] + r.counts['unpaired_reference']} unpaired; first {named}"


def main() -> None:
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    cases = work / "cases.json"
    todo = [[str(work / k), v] for k, v in CASES.items() if not (work / k).is_dir()]
    cases.write_text(json.dumps(todo))
    if todo:
        subprocess.run([sys.executable, str(HERE / "msprobe_runs.py"), "--many", str(cases)], check=True,
                       capture_output=True, timeout=900)
    for target, golden in PAIRS:
        print(f"{target} vs {golden}")
        print(f"  opscope: {opscope_verdict(work, target, golden)}")
        if not golden.endswith("ops"):  # msprobe compare reads msprobe dumps only
            print(f"  msprobe: {msprobe_verdict(work, target, golden)}")


if __name__ == "__main__":
    main()
