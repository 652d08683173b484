"""Replay: re-run an op in float64 on each side's own recorded inputs and say which side is
wrong (docs/replay.md). Runs aten ops, API-level calls (opscope's ``level="api"``, msprobe
tensor dumps) from an allow-list of pure math functions (:mod:`opscope.replay.api_names`),
and MindSpore kernels through a table of torch equivalents (:mod:`opscope.replay.mindspore_ops`).

- :func:`replay` — one op of two dumps (``"first"``, a culprit number, or ``rank:step:seq``).
- :func:`replay_culprits` — the top culprits of a :class:`~opscope.compare.result.CompareResult`;
  each finding gets ``.replay`` (also in summary.json and the console).
- :func:`register_replay` — a golden implementation for an op that cannot be re-run on CPU.
- :func:`culprits_pass` — :func:`replay_culprits` as a pass over a finished comparison,
  registered as ``"replay"`` (:mod:`opscope.compare.passes`): ``compare(..., replay=N)``.

Replay sits above compare: it takes a compare result (or runs compare); compare never
imports it. Importing this package is cheap; the engine (torch) loads on first use.
"""

from __future__ import annotations

import os
from typing import Any

from opscope.compare.passes import CompareInputs, ResultPass, register_result_pass
from opscope.replay.result import ReplayResult, SideReplay
from opscope.replay.rules import register_replay

__all__ = ["ReplayResult", "SideReplay", "culprits_pass", "register_replay", "replay", "replay_culprits"]


def replay(target: str | os.PathLike | Any, reference: str | os.PathLike | Any, op: str = "first", *,
           result: Any = None, summary: str | os.PathLike | dict[str, Any] | None = None,
           noise: Any = None, precision: str | None = None) -> ReplayResult:
    """Replay one op of two dumps in float64 on CPU and judge which side is wrong.

    Args:
        target, reference: the dumps (paths or :class:`opscope.Dump`), as given to compare.
        op: ``"first"`` (the first divergence), a culprit number (``"2"``) or an id
            ``"rank:step:seq"`` from the compare output.
        result: a :class:`~opscope.compare.result.CompareResult` of these dumps; else
            ``summary`` (a compare OUT directory, its summary.json, or the parsed dict);
            else the dumps are compared first (only the id's rank and step when one is given).
        noise: thresholds (:class:`~opscope.compare.tolerance.NoiseModel`); ``precision``
            forces the target's precision as in compare (e.g. "tf32").

    Returns:
        A :class:`ReplayResult` (``verdict``: target_wrong, reference_wrong, both_within,
        both_off, not_replayable).

    Raises:
        ReplayError: the id names no op, or no call could be located.
    """
    from opscope.compare.tolerance import NoiseModel
    from opscope.replay.engine import replay_call
    from opscope.replay.locate import locate
    from opscope.storage.reader import Dump, load

    t_dump = target if isinstance(target, Dump) else load(target)
    r_dump = reference if isinstance(reference, Dump) else load(reference)
    noise = noise or NoiseModel(precision=precision)
    try:
        source = result if result is not None else _summary(summary) if summary is not None else None
        if source is None:
            source = _compare_for(t_dump, r_dump, op, noise)
        return replay_call(t_dump, r_dump, locate(source, op), noise)
    finally:
        t_dump.close()
        r_dump.close()


def replay_culprits(result: Any, n: int, target: Any = None, reference: Any = None, *,
                    noise: Any = None) -> list[ReplayResult]:
    """Replay the top ``n`` culprits of a comparison; sets each finding's ``replay`` dict."""
    from opscope.compare.tolerance import NoiseModel
    from opscope.replay.engine import RowCache, replay_call
    from opscope.replay.locate import locate
    from opscope.storage.reader import load

    t_dump = target if target is not None else load(result.target)
    r_dump = reference if reference is not None else load(result.reference)
    noise = noise or NoiseModel()
    cache = RowCache()
    done = []
    try:
        for finding in [f for f in result.culprits if f.kind == "culprit"][: max(0, int(n))]:
            out = replay_call(t_dump, r_dump, locate(result, finding.id), noise, cache)
            finding.replay = out.to_dict()
            done.append(out)
    finally:  # tensor shards opened for the replay (they reopen on demand)
        t_dump.close()
        r_dump.close()
    return done


@register_result_pass("replay")
def culprits_pass(n: int) -> ResultPass:
    """Replay the top ``n`` culprits of a finished comparison on the dumps it read."""
    def run(result: Any, inputs: CompareInputs) -> None:
        replay_culprits(result, n, inputs.target, inputs.reference, noise=inputs.noise)
    return run


def _summary(summary: str | os.PathLike | dict[str, Any]) -> dict[str, Any]:
    import json
    from pathlib import Path

    from opscope.errors import ReplayError

    if isinstance(summary, dict):
        return summary
    path = Path(summary)
    path = path / "summary.json" if path.is_dir() else path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the compare summary {str(path)!r} ({exc}); give the -o directory "
                          "of opscope compare or its summary.json") from None


def _compare_for(t_dump: Any, r_dump: Any, op: str, noise: Any) -> Any:
    from opscope.compare.api import compare
    from opscope.replay.locate import _ID

    match = _ID.match(str(op).strip())
    ranks, steps = ([int(match.group(1))], [int(match.group(2))]) if match else (None, None)
    return compare(t_dump, r_dump, workers=1, noise=noise, ranks=ranks, steps=steps)
