"""opscope.monitor on real training with real trouble injected at step K: it names step K and
the tensor where the trouble starts, and stays quiet on the same runs without the trouble."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import opscope
from opscope.demo.models import TinyTransformer

K = 22
STEPS = 34


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: a second intra-op thread only waits for the first (and for a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def transformer(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, list[torch.Tensor]]:
    torch.manual_seed(seed)
    model = TinyTransformer(vocab=32, d=32, heads=2, layers=2, seq=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    data = [torch.randint(0, 32, (4, 17), generator=gen) for _ in range(8)]
    return model, opt, data


def train(path, model, opt, data, before_step=None, autocast: bool = False, **keys):
    """STEPS steps of next-token training under a monitor; ``before_step(i)`` injects trouble."""
    with opscope.monitor(path, overwrite=True, **keys) as m:
        for i in range(STEPS):
            if before_step is not None:
                before_step(i)
            tokens = data[i % len(data)]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.step(loss=loss)
    return m.result


def scale_gradient_entering(module: nn.Module, factor: float):
    def hook(mod, grad_output):
        return tuple(g * factor if g is not None else None for g in grad_output)
    return module.register_full_backward_pre_hook(hook)


def test_a_layer_whose_gradient_is_scaled_by_1e3_from_step_k_is_named_at_step_k(tmp_path):
    model, opt, data = transformer()
    bug = model.layers[1].fc1

    def inject(i):
        if i == K:
            scale_gradient_entering(bug, 1e3)

    result = train(tmp_path / "m", model, opt, data, inject, targets="all", modules=["layers.0", "layers.1"])
    assert not result
    first = result.events[0]
    assert first.step == K
    assert first.first.kind == "grad" and first.first.name.startswith("layers.1.fc1."), first.first
    assert first.first.factor > 100
    # the symptoms downstream in backward (layer 0's gradients, the state) moved too, but later
    labels = [d.label for d in first.departures]
    assert "layers.0.fc1.weight (grad)" in labels and labels.index("layers.0.fc1.weight (grad)") > 0


def test_a_learning_rate_spike_at_step_k_names_the_learning_rate(tmp_path):
    model, opt, data = transformer()

    def inject(i):
        opt.param_groups[0]["lr"] = 3e-2 if i == K else 1e-3

    result = train(tmp_path / "m", model, opt, data, inject, targets=["grads", "loss", "lr", "weights"])
    first = result.events[0]
    assert (first.step, first.first.kind) == (K, "lr")
    assert first.first.factor == pytest.approx(30)
    assert all(e.step >= K for e in result.events)


def test_a_corrupted_batch_at_step_k_names_the_input(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 16, generator=gen), torch.randint(0, 4, (32,), generator=gen)) for _ in range(8)]
    with opscope.monitor(tmp_path / "m", targets="all") as m:
        for i in range(STEPS):
            x, y = data[i % len(data)]
            if i == K:
                x = x * 1e3  # a batch read with the wrong scaling
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.step(loss=loss)
    result = m.result
    first = result.events[0]
    assert (first.step, first.first.kind, first.first.name) == (K, "input", "arg0")
    assert len(result.events) == 1 or result.events[1].step > K


def test_adam_eps_too_small_for_float16_names_exp_avg_sq_of_the_layer_it_broke(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)).half()
    late = model[2]  # unfrozen at step K, in a param group with the usual eps=1e-8
    late.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3, eps=1e-4)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 16, generator=gen).half(), torch.randint(0, 4, (32,), generator=gen)) for _ in range(8)]
    with opscope.monitor(tmp_path / "m", targets=["grads", "loss", "optimizer", "weights"]) as m:
        for i in range(STEPS):
            if i == K:
                late.requires_grad_(True)
                opt.add_param_group({"params": list(late.parameters()), "eps": 1e-8})  # 0 in float16
            x, y = data[i % len(data)]
            loss = nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.step(loss=loss)
            if not torch.isfinite(loss):
                break
    first = m.result.events[0]
    assert first.step == K
    assert first.first.kind == "exp_avg_sq" and first.first.name in ("2.weight", "2.bias"), first.first
    assert "eps=1e-08 is 0 in float16" in first.first.reason
    named = {(d.kind, d.name) for d in first.departures}
    assert {("exp_avg_sq", "2.weight"), ("exp_avg_sq", "2.bias")} <= named
    assert not any(name.startswith(("0.", "4.")) for _, name in named)  # the layers trained all along


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_no_alarm_on_a_clean_run_of_the_same_length(tmp_path, autocast):
    model, opt, data = transformer()
    result = train(tmp_path / "m", model, opt, data, autocast=autocast, targets="all",
                   modules=["layers.0", "layers.1"])
    assert result, [e.to_json() for e in result.events][:1]
    rank = result.ranks[0]
    assert rank.steps == STEPS and rank.status == "complete"
    assert len(rank.values[("grad", "layers.1.fc1.weight", "norm")][0]) == STEPS


def test_a_hugging_face_gpt2_with_a_scaled_gradient_in_its_second_block(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 64, (4, 16), generator=gen) for _ in range(8)]
    bug = model.transformer.h[1].mlp.c_proj
    with opscope.monitor(tmp_path / "m", targets="all", modules=["transformer.h.0", "transformer.h.1"]) as m:
        for i in range(STEPS):
            if i == K:
                scale_gradient_entering(bug, 1e3)
            tokens = data[i % len(data)]
            loss = model(input_ids=tokens, labels=tokens).loss  # the model is found, called with keywords
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.step(loss=loss)
    result = m.result
    first = result.events[0]
    assert first.step == K
    assert first.first.kind == "grad" and first.first.name.startswith("transformer.h.1.mlp.c_proj."), first.first
    assert ("input", "input_ids", "norm") in result.ranks[0].values
