"""Step boundaries on a Hugging Face model trained the way ``transformers.Trainer`` does it
(``Trainer`` itself needs ``accelerate``, which opscope's test environment does not install):
``model.zero_grad()`` once before the loop, the step's micro-batches fetched up front, k
forwards and backwards, gradient clipping, ``optimizer.step()``, ``lr_scheduler.step()``,
``model.zero_grad()``."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import opscope  # noqa: E402

torch.set_num_threads(1)
STEPS, MICRO = 4, 2


def _tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def trainer_loop(session, user_step: bool) -> list[int]:
    """Returns the session's step index seen by each micro-batch's forward (dump, watch)."""
    model = _tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ids = torch.randint(0, 64, (STEPS * MICRO, 8))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=1)
    batches = iter(loader)
    seen: list[int] = []  # the session's step index when each micro-batch's embedding runs
    if hasattr(session, "step_index"):
        model.transformer.wte.register_forward_pre_hook(lambda m, a: seen.append(session.step_index))
    model.zero_grad()
    for _ in range(STEPS):
        micro = [next(batches)[0] for _ in range(MICRO)]  # Trainer's get_batch_samples
        for batch in micro:
            loss = model(input_ids=batch, labels=batch).loss / MICRO
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        model.zero_grad()
        if user_step:
            session.step()
    return seen


@pytest.mark.parametrize("user_step", [False, True])
def test_profile_one_step_per_optimizer_step(tmp_path, user_step) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opscope.profile(tmp_path / "p", steps="1-2", task_trace=True) as p:
            trainer_loop(p, user_step)
    rows = p.result.steps
    assert [r.step for r in rows] == list(range(STEPS))
    assert all(r.phases["forward"] > 0 and r.phases["backward"] > 0 and r.phases["optimizer"] > 0 for r in rows)
    assert [r.step for r in rows if r.task_trace] == [1, 2]


@pytest.mark.parametrize("user_step", [False, True])
def test_dump_one_step_per_optimizer_step(tmp_path, user_step) -> None:
    session = opscope.dump(tmp_path / "d", level="module", data="statistics")
    with session as d:
        seen = trainer_loop(d, user_step)
    assert seen == [i // MICRO for i in range(STEPS * MICRO)]
    assert opscope.load(tmp_path / "d").steps() == list(range(STEPS))
