"""Measuring and judging a comparison a few (rank, step) partitions at a time, so the compare
process holds one window of the index, never the whole dump's.

:func:`opscope.compare` aligns partitions in (rank, step) order and hands them over in
windows of about :data:`WINDOW_PAIRS` pairs (one partition when it is larger). A window's
tensor pairs are measured together (in the pool or on the cluster, as one plan), then each of
its partitions is judged on its own: every index of the verdict is per rank and step, the
ranking of findings is a sort of the findings alone, and what judging a step needs of the
rank's previous step is carried in ``previous``. Its slice of the pairs table goes to the
:class:`~opscope.compare.pairs_file.PairsFile`, its findings are kept (each with what replay
needs), and its rows and pairs are let go before the next window is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from opscope.compare import collectives, measure
from opscope.compare.align import INPUT_IO, PHASE_ORDER, Pair
from opscope.compare.pairs_file import PairsFile
from opscope.compare.result import COUNT_KEYS, Finding
from opscope.compare.tolerance import NoiseModel

WINDOW_PAIRS = 20_000  # pairs aligned before a window is measured and judged (~3 KB each until then)
Partition = tuple[int, int, list[Pair]]  # rank, step, its pairs


class PartitionedRun:
    """What a comparison keeps while its windows go by: findings, counts, the pairs table."""

    def __init__(self, t_dump: Any, r_dump: Any, noise: NoiseModel, *, workers: int, scheduler: Any = None,
                 progress: Callable[[int, int], None] | None = None, pairs_file: PairsFile | None = None) -> None:
        self.dumps, self.noise, self.workers, self.scheduler = (t_dump, r_dump), noise, workers, scheduler
        self.progress = progress
        self.trust_hashes = measure.hashes_comparable(t_dump.manifest, r_dump.manifest)
        self.exact_std = measure.stds_exact(t_dump.manifest, r_dump.manifest)
        self.pairs_file = pairs_file or PairsFile()
        self.findings: list[Finding] = []
        self.counts = dict.fromkeys(COUNT_KEYS, 0)
        self.statistics_only = False
        self.bytes_compared = 0
        self.problems: list[str] = []  # from the measurement (unreadable tensors)
        self.previous: dict[int, dict[str, Any]] = {}  # per rank: what judging its next step reads
        self.notes: list[str] = []  # what the findings need said beside them (collectives.settle)
        self._fed: list[Finding] = []  # reads of collectives' values that other ranks made differ
        self._collective_inputs: dict[tuple[int, int, int], bool] = {}
        self._ranks: set[int] = set()
        self._done = self._total = 0  # tensor bytes of the windows before, for progress
        self._cluster = contextlib.ExitStack()
        self._client: Any = None

    def __enter__(self) -> PartitionedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the cluster's client, if this run opened one."""
        self._cluster.close()

    def run_window(self, window: list[Partition]) -> None:
        """Measure the window's pairs, then judge and write each partition; empties ``window``."""
        pairs = [p for _, _, part in window for p in part]
        jobs = measure.plan(pairs, self.noise, trust_hashes=self.trust_hashes, exact_std=self.exact_std)
        nbytes = sum(j.nbytes for j in jobs)
        self.bytes_compared += nbytes
        paths = str(self.dumps[0].path), str(self.dumps[1].path)
        progress = self._progress(nbytes)
        if self.scheduler is not None and jobs:
            from opscope.compare import distributed

            if self._client is None:  # one connection for every window, opened when a task is to be sent
                self._client = self._cluster.enter_context(distributed.connect(self.scheduler))
            self.problems += distributed.run(jobs, pairs, *paths, scheduler=self._client, progress=progress,
                                             trust_hashes=self.trust_hashes, exact_std=self.exact_std)
        else:
            self.problems += measure.run(jobs, pairs, *paths, workers=self.workers, progress=progress,
                                         trust_hashes=self.trust_hashes, exact_std=self.exact_std)
        self._done += nbytes
        del pairs, jobs
        window.reverse()
        while window:  # each partition let go as soon as it is written
            self._judge(*window.pop())

    def close(self) -> list[Finding]:
        """The findings in execution order (the first is the first divergence)."""
        from opscope.compare.blame import execution_order

        self.pairs_file.close()
        if len(self._ranks) > 1:
            self.notes += collectives.received_gradients(self.findings)
        if self._fed:
            world = int(self.dumps[0].manifest.get("world_size") or 0)  # (peer dumps may not say)
            ranks = set(range(world)) if world else set(self._ranks)
            self.notes += collectives.settle(self.findings, self._fed, self._collective_inputs, ranks - self._ranks,
                                             ranks | self._ranks)
        self.findings.sort(key=execution_order)
        return self.findings

    def _judge(self, rank: int, step: int, pairs: list[Pair]) -> None:
        from opscope.compare.table import pairs_table
        from opscope.compare.verdict import run_passes

        state = run_passes(pairs, self.noise, self.previous)
        identify(state)
        self.findings += state.findings
        self._ranks.add(rank)
        if state.collective_fed:
            identify_fed(state.collective_fed)
            self._fed += state.collective_fed
        self._collective_inputs.update(collectives.identical_inputs(pairs))
        del state  # its indexes (~900 bytes a pair) before the table is built
        pairs.sort(key=order)
        count(pairs, self.counts)
        self.statistics_only = self.statistics_only or any(p.mode == "statistics" for p in pairs)
        self.pairs_file.append(pairs_table(pairs, start=self.pairs_file.num_rows), rank, step)

    def _progress(self, nbytes: int) -> Callable[[int, int], None] | None:
        """This window's progress as the whole run's: bytes done before it, and so far in all."""
        if self.progress is None:
            return None
        report, before = self.progress, self._done
        self._total += nbytes
        total = self._total

        def window_progress(done: int, _: int) -> None:
            report(before + done, total)

        return window_progress


def order(pair: Pair) -> tuple[Any, ...]:
    """Execution order of a pair: rank, step, phase, call, inputs before outputs, slot."""
    home = pair.home
    return (home["rank"], home["step"], PHASE_ORDER.get(home.get("phase") or "", 9), home["seq"],
            home.get("io") == "output", home.get("slot") or 0)


def count(pairs: list[Pair], counts: dict[str, int]) -> None:
    """Add these pairs to ``counts`` (pairs, identical, passed, failed, skipped, unpaired_*)."""
    for pair in pairs:
        if pair.kind in ("unpaired", "identity"):
            counts[f"unpaired_{pair.side}"] += 1
            continue
        counts["pairs"] += 1
        counts[pair.status if pair.status in counts else "skipped"] += 1


def identify_fed(found: list[Finding]) -> None:
    """The ``id`` of each collective that :func:`collectives.settle` may name."""
    for f in found:
        f.id = f"{f.rank}:{f.step}:{f.seq}"


def identify(state: Any) -> None:
    """Give each finding an ``id`` and, for culprits, the ``calls`` that replay and a second,
    tensor-capturing dump need: per side, its record seq and the keys (phase, module, op,
    call) of the call itself and of the calls that produced its inputs."""
    nodes = {(n.side, n.rank, n.step, int(n.worst.home["seq"])): n for n in state.nodes
             if n.verdict == "culprit" and n.worst is not None}
    for f in state.findings:
        home = "reference" if f.side == "reference" else "target"
        f.id = f"{f.rank}:{f.step}:{'r' if home == 'reference' else ''}{f.seq}"
        node = nodes.get((home, f.rank, f.step, f.seq)) if f.kind == "culprit" else None
        if node is None:
            continue
        worst = node.worst
        for side, row in (("target", worst.t), ("reference", worst.r)):
            if row is None or (worst.kind == "identity" and side != home):
                continue
            keys: list[list[Any]] = []
            rows = [row] + [state.rows.get((side, row["rank"], row["step"], r["producer"]))
                            for r in state.calls.get((side, row["rank"], row["step"], row["cseq"]), [])
                            if r.get("io") in INPUT_IO and r.get("producer") is not None]
            for r in rows:
                key = r and [r.get("phase"), r.get("orig_module", r.get("module")) or "",
                             r.get("orig_op", r.get("op")), r.get("call")]
                if key and key not in keys:
                    keys.append(key)
            f.calls[side] = {"seq": int(row["seq"]), "capture": keys}
