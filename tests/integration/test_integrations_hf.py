"""The real ``transformers.Trainer`` (tiny random GPT-2, no download, gradient accumulation
over 2 micro-batches): opscope's steps are the Trainer's optimizer steps, with opscope's
automatic step detection around ``trainer.train()`` and with ``OpscopeCallback``."""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import opscope  # noqa: E402
from opscope.integrations.huggingface import OpscopeCallback  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from integration_checks import check_driven, driven_sessions  # noqa: E402

torch.set_num_threads(1)  # a tiny model: more threads only wait for each other on a busy machine
STEPS, MICRO = 4, 2


class _Ids(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return STEPS * MICRO

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class _Witness(transformers.TrainerCallback):
    """What the Trainer did, when: each micro-batch's forward (with the session's step index
    when it has one) and the end of each ``optimizer.step()``, on perf_counter_ns."""

    def __init__(self, session=None) -> None:
        self.session, self.forwards, self.optimizer_steps = session, [], []
        self.losses, self.rates = [], []

    def on_train_begin(self, args, state, control, model=None, **kwargs) -> None:
        def pre(module, a) -> None:
            index = getattr(self.session, "step_index", None)
            self.forwards.append((time.perf_counter_ns(), state.global_step, index))

        model.transformer.wte.register_forward_pre_hook(pre)

    def on_optimizer_step(self, args, state, control, **kwargs) -> None:
        self.optimizer_steps.append(time.perf_counter_ns())

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
            self.rates.append(float(logs["learning_rate"]))


def _train(tmp_path, callbacks) -> transformers.Trainer:
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=1, gradient_accumulation_steps=MICRO,
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, log_level="error")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Ids(), callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return trainer


def test_profile_around_train_times_each_optimizer_step(tmp_path) -> None:
    witness = _Witness()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opscope.profile(tmp_path / "p", steps="1-2", task_trace=True) as p:
            _train(tmp_path, [witness])
    rows = p.result.steps
    assert [r.step for r in rows] == list(range(STEPS))
    assert [r.step for r in rows if r.task_trace] == [1, 2]
    for row in rows:  # step k holds micro-batches 2k and 2k+1 and optimizer step k
        start, end = p.origin + row.start_ns, p.origin + row.start_ns + row.wall_ns
        inside = [i for i, (t, _, _) in enumerate(witness.forwards) if start <= t <= end]
        assert inside == [MICRO * row.step + j for j in range(MICRO)]
        assert start <= witness.optimizer_steps[row.step] <= end
        assert row.phases["forward"] > 0 and row.phases["backward"] > 0 and row.phases["optimizer"] > 0


def test_dump_around_train_names_optimizer_steps(tmp_path) -> None:
    session = opscope.dump(tmp_path / "d", level="module", data="statistics", steps="1-2")
    witness = _Witness(session)
    with session:
        _train(tmp_path, [witness])
    assert [index for _, _, index in witness.forwards] == [i // MICRO for i in range(STEPS * MICRO)]
    assert [trainer_step for _, trainer_step, _ in witness.forwards] == [i // MICRO for i in range(STEPS * MICRO)]
    assert opscope.load(tmp_path / "d").steps() == [1, 2]


def test_callback_drives_dump_profile_and_monitor(tmp_path) -> None:
    dump, profile, monitor = driven_sessions(tmp_path)
    witness = _Witness(dump)
    _train(tmp_path, [OpscopeCallback(dump=dump, profile=profile, monitor=monitor), witness])
    assert [index for _, _, index in witness.forwards] == [i // MICRO for i in range(STEPS * MICRO)]
    # the monitor's loss: the Trainer's logged loss, each step; its lr: as the step used it,
    # before the scheduler's step
    check_driven(tmp_path / "d", dump, profile, monitor, STEPS, witness.losses, witness.rates, rel=1e-6)
