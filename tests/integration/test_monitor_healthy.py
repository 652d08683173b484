"""No alarm on healthy training: tiny random-config Hugging Face models (GPT-2, Llama, BERT;
built as real_models.py builds them, nothing downloaded), two seeds, 200 and 120 steps, float32
and bfloat16 autocast, a learnable bigram language under a linear warm-up then cosine decay of
the learning rate, and random tokens under a constant one; and the benchmark's reference
transformer, whose loss once raised a false alarm.

These runs have the early phase where the loss falls fast, a learning rate that climbs from 0
and decays, gradients that grow as the model leaves its initialisation, a tiny Llama's layer-0
gradients jumping 12-15x for one step (the loss went on falling), a gradient of a norm's output
jumping 1e4x for one step with no trace in any parameter's gradient, exp_avg_sq of a bias that
gets no gradient going from 0 to 1e-22: none of it is trouble (docs/monitor.md, "What is
detected"). The faults the monitor must catch on the same kind of runs: test_monitor_faults.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import opscope
from opscope.monitor.session import MonitorSession

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from real_models import FAMILIES, VOCAB  # noqa: E402
from test_monitor_faults import one_thread  # noqa: E402, F401 (autouse: one torch thread)

BLOCKS = {"gpt2": "transformer.h.*", "llama": "model.layers.*", "bert": "bert.encoder.layer.*"}
SEQ, BATCH = 16, 8


def bigram_batches(seed: int):
    """Batches of a random bigram language (sparse rows): a loss that keeps falling for hundreds of steps."""
    rng = np.random.default_rng(seed)
    cumulative = rng.dirichlet(np.full(VOCAB, 0.1), size=VOCAB).cumsum(1)

    def batch(i: int) -> torch.Tensor:
        ids = np.empty((BATCH, SEQ), dtype=np.int64)
        ids[:, 0] = rng.integers(0, VOCAB, BATCH)
        u = rng.random((BATCH, SEQ))
        for j in range(1, SEQ):
            ids[:, j] = np.minimum((u[:, j, None] > cumulative[ids[:, j - 1]]).sum(1), VOCAB - 1)
        return torch.from_numpy(ids)
    return batch


def random_batches(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return lambda i: torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)


def train(path, arch: str, seed: int, steps: int, learnable: bool, autocast: bool) -> MonitorSession:
    torch.manual_seed(seed)
    model = FAMILIES[arch].build("eager")
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    schedule = (transformers.get_cosine_schedule_with_warmup(opt, steps // 10, steps) if learnable
                else torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    batches = bigram_batches(seed) if learnable else random_batches(seed)
    masks = torch.Generator().manual_seed(seed)
    with opscope.monitor(path, targets="all", modules=[BLOCKS[arch]], report=False) as m:
        for i in range(steps):
            ids = batches(i)
            labels = ids.clone()
            if arch == "bert":  # masked LM: 15% of the tokens, replaced by token 4
                masked = torch.rand(ids.shape, generator=masks) < 0.15
                labels[~masked] = -100
                ids = ids.masked_fill(masked, 4)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            schedule.step()
            opt.zero_grad()
            m.step(loss=loss)
    return m


@pytest.mark.slow
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert"])
def test_no_alarm_on_healthy_training_of_hugging_face_models(tmp_path, arch, autocast):
    for seed, steps, learnable in ((0, 200, True), (1, 120, False)):
        m = train(tmp_path / f"m{seed}", arch, seed, steps, learnable, autocast)
        result = m.result
        assert result, [e.to_json() for e in result.events][:1]
        rank = result.ranks[0]
        assert rank.steps == steps and len(m.series) > 40  # every kind was followed and judged
        loss = rank.values[("loss", "loss", "value")][1]
        if learnable and arch != "bert":  # it learned: the loss fell well below log(VOCAB) (BERT's masked LM, less)
            assert np.mean(loss[-20:]) < 0.85 * np.mean(loss[:5])


def test_no_alarm_on_the_benchmark_transformer_resumed_with_its_data_loop_restarted(tmp_path):
    """bench_monitor.py's memory runs: one model, 16 random batches, each run restarting at batch 0.
    Batches 14 and 15 then come back after twice the gap, and their loss is ~10% above the rest:
    the old detector said "loss moved first" at step 14 (z=9.9)."""
    from opscope.demo.models import train_step, transformer_task

    model, opt, batch = transformer_task()
    for _ in range(3):
        for i in range(30):
            train_step(model, opt, *batch(i))
    losses = []
    with opscope.monitor(tmp_path / "m", model=model, optimizer=opt, report=False,
                         targets=["grads", "loss", "lr", "optimizer"]) as m:
        for i in range(30):
            losses.append(train_step(model, opt, *batch(i)))
            m.step(loss=losses[-1])
    assert min(losses[14:16]) > 1.05 * np.median(losses)  # the bump is there
    assert m.result, [e.to_json() for e in m.result.events][:1]
