"""The generation matrix: every generating family, variant and level, each verdict against what it
should be (docs/compare.md, Real models, "Text generation").

``python tests/integration/real_generation_matrix.py OUT [--levels aten,api,module]
[--families gpt2,llama] [--variants same,bf16] [--pad left]`` generates into OUT and prints a line per case
(``OK`` / ``BAD``) and the tally; exit 1 if any case is not as expected. The 189 cases (six
decoders and two encoder-decoders) take about 6 minutes on two cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import real_generation as rg  # noqa: E402
import real_models as rm  # noqa: E402

VARIANTS = ("same", "bf16", "sdpa", *rm.FAULTS, "decode_scale")
KWARGS: dict[str, dict[str, Any]] = {"same": {}, "bf16": {"dtype": "bfloat16"}, "sdpa": {"attn": "sdpa"}}


def expected(result: Any, family: str, variant: str, level: str, apart: int | None,
             pad: str | None = None) -> bool:
    """Is this verdict the right one for the case (``pad``: the prompts' padding)?"""
    first = result.first_divergence
    choices = [n for n in result.notes if "chose differently" in n]
    if pad == "left" and variant == "sdpa" and first is not None and "without any key" in first.note:
        # the left pads' rows, filled by each attention's convention (compare/masked_rows.py):
        # the prompt's step, while the tokens agree
        return apart is None and (first.kind, first.step) == ("culprit", 0)
    if variant == "same":
        return bool(result.verdict == "identical")
    if variant in ("bf16", "sdpa"):
        if level == "module" and apart is not None:  # the choice is not recorded: the next input is a root
            return first is not None and (first.kind, first.step) == ("root", apart + 1) and len(result.culprits) == 1
        return (result.verdict == "within_tolerance" and not result.culprits
                and (apart is None or (len(choices) == 1 and f"step {apart}:" in choices[0])))
    if variant == "decode_scale":
        if level == "module" and family == "t5":  # T5's decoder scores are ~0 on this random model: the
            return bool(result.verdict == "within_tolerance")  # scale moves its output ~1e-8, below rounding
        # an encoder-decoder's first decoding step attends to one key: the softmax hides the scale
        # from the module's output (the ops show it)
        step = 2 if level == "module" and family in rg.DECODER_ATTENTION else 1
        return first is not None and (first.kind, first.step, first.module) == (
            "culprit", step, rg.decode_attention(family))
    kind = "root" if variant == "weight_row" else "culprit"
    return first is not None and not choices and (first.kind, first.step, first.module) == (
        kind, 0, rm.fault_module(family, variant))


def main(argv: list[str]) -> int:
    import opscope

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--levels", default="aten,api,module")
    parser.add_argument("--families", default=",".join((*rg.DECODERS, *rg.DECODER_ATTENTION)))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--pad", default=None, help="pad the prompts on this side (left, right)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tally = {"OK": 0, "BAD": 0}
    for level in args.levels.split(","):
        for family in args.families.split(","):
            ref = args.out / f"{family}-{level}-reference"
            ref_ids = rg.generate(family, ref, level=level, pad=args.pad)
            for variant in args.variants.split(","):
                if variant == "sdpa" and not rm.ALL_FAMILIES[family].sdpa:
                    continue
                path = args.out / f"{family}-{level}-{variant}"
                ids = rg.generate(family, path, level=level, pad=args.pad, **KWARGS.get(variant, {"fault": variant}))
                result = opscope.compare(path, ref)
                apart = rg.first_step_apart(ids, ref_ids, family)
                mark = "OK" if expected(result, family, variant, level, apart, args.pad) else "BAD"
                tally[mark] += 1
                first = result.first_divergence
                found = first and (first.kind, first.step, first.module or "(top level)", first.op)
                print(f"{mark:3} {level:6} {family:8} {variant:12} tokens apart at {apart}: {result.verdict} {found}",
                      flush=True)
    print(tally)
    return 1 if tally["BAD"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
