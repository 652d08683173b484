"""Profile failures a user meets: a full disk, and a trace bigger than memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import opscope
from opscope.demo.models import mlp_task, train_step

SCRIPT = textwrap.dedent("""
    import resource, signal, sys, warnings
    import opscope
    from opscope.demo.models import mlp_task, train_step
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    model, opt, batch = mlp_task()
    fail_in_training = sys.argv[3] == "raise"
    try:
        with warnings.catch_warnings(record=True) as caught, \\
                opscope.profile(sys.argv[1], steps="2-4", task_trace=True) as p:
            warnings.simplefilter("always")
            for i in range(6):
                train_step(model, opt, *batch(i)); p.step()
                if fail_in_training and i == 3:
                    raise KeyError("the user's own error")
    except opscope.OpscopeError as exc:
        print("OPSCOPE:", exc); sys.exit(3)
    except KeyError as exc:
        print("USER:", exc, "| WARNINGS:", [str(w.message) for w in caught]); sys.exit(4)
""")


def _run(tmp_path, limit: int, mode: str):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), str(tmp_path / f"prof{limit}"), str(limit), mode],
                          capture_output=True, text=True, timeout=240)


def test_full_disk_gives_a_clear_error_naming_the_incomplete_profile(tmp_path):
    for limit in (3000, 9000):  # fails on the step table, then on the trace
        proc = _run(tmp_path, limit, "ok")
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "is incomplete" in proc.stdout and "check free space" in proc.stdout
        assert "Traceback" not in proc.stderr
        # never half a file under the final name
        assert not (tmp_path / f"prof{limit}" / "rank0" / "trace.json.gz").exists()


def test_full_disk_never_hides_the_users_own_exception(tmp_path):
    proc = _run(tmp_path, 3000, "raise")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "the user's own error" in proc.stdout and "is incomplete" in proc.stdout


def test_trace_is_streamed_to_disk_step_by_step(tmp_path):
    model, opt, batch = mlp_task()
    partial = tmp_path / "prof" / "rank0" / "trace.json.gz.partial"
    sizes = []
    with opscope.profile(tmp_path / "prof", steps="1-6", task_trace=True) as p:
        for i in range(8):
            train_step(model, opt, *batch(i))
            p.step()
            if partial.exists():
                sizes.append(partial.stat().st_size)
    # events leave memory as each traced step ends: the file grows during the run (after
    # iteration 0 step 1 has just begun and nothing is written yet; after iteration 1 it is)
    assert len(sizes) >= 5 and sizes[-1] > sizes[1] > 0
    assert (tmp_path / "prof" / "rank0" / "trace.json.gz").exists() and not partial.exists()


def test_task_trace_keeps_stderr_clean(tmp_path):
    """The profiler library prints a USDT line at every start and stop; opscope drops those."""
    script = textwrap.dedent(f"""
        import sys, opscope
        from opscope.demo.models import mlp_task, train_step
        model, opt, batch = mlp_task()
        with opscope.profile({str(tmp_path / 'p')!r}, steps="1-3", task_trace=True) as p:
            for i in range(5):
                train_step(model, opt, *batch(i)); p.step()
        print("a line of the user's", file=sys.stderr)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "USDT" not in proc.stderr and "a line of the user's" in proc.stderr
