"""Compare on a real Dask cluster (scheduler and worker processes on loopback, never a mock):
the same result as a local run, a worker killed mid-compare, an unreadable shard named, and
the errors a user meets (no scheduler, no ``distributed``, workers that do not see the dumps)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, WorkerPlugin
from synth import mlp_run

from opscope.compare.api import compare
from opscope.compare.distributed import ClusterError


@pytest.fixture(scope="module")
def scheduler_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dask") / "scheduler.json"


@pytest.fixture(scope="module")
def cluster(scheduler_file):
    """Two worker processes of one thread each, started once for this module; the scheduler
    writes its address into ``scheduler_file`` as `dask scheduler --scheduler-file` does."""
    with (LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0",
                       scheduler_kwargs={"scheduler_file": str(scheduler_file)},
                       local_directory=str(scheduler_file.parent)) as local,
          Client(local, set_as_default=False) as client):
        yield client


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """A reference and a target whose GELU was switched to its tanh form (the culprit), with
    noise so that every pair needs its tensors read."""
    root = tmp_path_factory.mktemp("dask-dumps")
    return (mlp_run(root / "target", steps=3, fault="gelu_tanh", noise=1e-6),
            mlp_run(root / "reference", steps=3))


def _same(local, remote) -> None:
    assert remote.verdict == local.verdict
    assert remote.first_divergence.where == local.first_divergence.where
    assert remote.counts == local.counts
    assert remote.problems == local.problems
    assert remote.pairs_table.equals(local.pairs_table)


def test_cli_on_cluster_writes_the_files_of_a_local_run(dumps, cluster, run_cli, tmp_path):
    from opscope.report.compare_files import write_all

    local = compare(*dumps, workers=1)  # what `opscope compare` runs and writes, in this process
    write_all(local, tmp_path / "local")
    remote = run_cli("compare", *dumps, "-o", tmp_path / "dask", "-q", "--scheduler", cluster.scheduler.address)
    assert remote.returncode == 1 and remote.stdout.startswith("diverged: "), remote.stderr
    assert local.first_divergence.where in remote.stdout and "aten.gelu.default" in remote.stdout  # the fault
    summaries = []
    for side in ("local", "dask"):
        summary = json.loads((tmp_path / side / "summary.json").read_text())
        assert summary.pop("elapsed_s") > 0
        summary["settings"].pop("workers")
        summaries.append(summary)
    assert _flat(summaries[0]) == _flat(summaries[1])
    assert summaries[0]["verdict"] == "diverged" and summaries[0]["counts"]["failed"] > 0
    local_csv, dask_csv = ((tmp_path / side / "pairs.csv").read_bytes() for side in ("local", "dask"))
    assert dask_csv == local_csv and local_csv.count(b"\n") > 30
    local_html, dask_html = (re.sub(r'"(elapsed_s|workers)":[0-9.]+', "", (tmp_path / side / "report.html").read_text())
                             for side in ("local", "dask"))  # the report embeds the summary
    assert dask_html == local_html


def test_progress_follows_the_tasks(dumps, cluster):
    calls: list[tuple[int, int]] = []
    result = compare(*dumps, scheduler=cluster, progress=lambda done, total: calls.append((done, total)))
    assert len(calls) > 1  # one call per finished batch, not one at the end
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert calls[-1][0] == calls[-1][1] == result.bytes_compared


def _flat(value, where=""):
    """Every leaf of a JSON document by its path (a failing assert then names the leaves that differ)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{where}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{where}[{i}]").items()}
    return {where: value}


class KillOnce(WorkerPlugin):
    """Kills its worker process (SIGKILL) as the first measuring task of the cluster starts."""

    name = "opscope-kill-once"

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def transition(self, key, start, finish, **kwargs) -> None:
        if finish != "executing" or not str(key).startswith("opscope-measure-"):
            return
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # one kill per test
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_mid_compare_loses_nothing(dumps, cluster, tmp_path):
    local = compare(*dumps, workers=1)
    pids = set(cluster.run(os.getpid).values())
    marker = tmp_path / "killed"
    cluster.register_plugin(KillOnce(str(marker)))
    try:
        remote = compare(*dumps, scheduler=cluster)
    finally:
        cluster.unregister_worker_plugin(KillOnce.name)
    killed = int(marker.read_text())
    assert killed in pids  # a worker of the cluster died running a task ...
    _same(local, remote)  # ... and its task ran again elsewhere: nothing lost
    assert {p["mode"] for p in remote.pairs_table.to_pylist() if p["mode"] != "hash"} <= {"tensor", "identity"}
    cluster.wait_for_workers(2, timeout=60)  # the nanny restarts the killed worker for the next tests
    assert killed not in set(cluster.run(os.getpid).values())


def test_a_cluster_whose_last_worker_died_is_an_error_not_a_wait(dumps, tmp_path, monkeypatch):
    """A worker without a nanny (`dask worker --no-nanny`, a batch job's) is not brought back:
    killed at its first task, it leaves Dask's tasks waiting for a worker for good. The compare
    says so after WORKER_WAIT_S instead of waiting with them."""
    import time

    from opscope.compare import distributed as remote

    monkeypatch.setattr(remote, "WORKER_WAIT_S", 1.0)
    monkeypatch.setattr(remote, "POLL_S", 0.2)
    dask_cli = Path(sys.executable).with_name("dask")
    with (LocalCluster(n_workers=0, processes=True, dashboard_address=":0", local_directory=str(tmp_path)) as local,
          Client(local, set_as_default=False) as client):
        worker = subprocess.Popen([str(dask_cli), "worker", local.scheduler_address, "--no-nanny", "--nthreads", "1",
                                   "--no-dashboard", "--local-directory", str(tmp_path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))})
        try:  # (the test's path: the worker unpickles KillOnce)
            client.wait_for_workers(1, timeout=120)
            client.register_plugin(KillOnce(str(tmp_path / "killed")))
            start = time.monotonic()
            with pytest.raises(ClusterError) as info:
                compare(*dumps, scheduler=client)
            waited = time.monotonic() - start
            assert worker.wait(timeout=60) == -signal.SIGKILL  # it died at its first task, as planned
        finally:
            worker.kill()
            worker.wait(timeout=60)
    message = str(info.value)
    assert local.scheduler_address in message and "no workers for 1 s" in message, message
    left, tasks = map(int, re.search(r"with (\d+) of (\d+) measuring tasks", message).groups())
    assert 0 < left <= tasks and "dask worker" in message
    assert waited < 60  # the 1 s given, a poll and the kill, not Dask's wait for good


def test_a_shard_no_worker_can_read_is_named(dumps, cluster, tmp_path):
    import shutil

    target = Path(shutil.copytree(dumps[0], tmp_path / "target"))
    shard = sorted((target / "rank0" / "step1").glob("tensors-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:200])  # truncated: its header is cut
    remote = compare(target, dumps[1], scheduler=cluster)
    local = compare(target, dumps[1], workers=1)
    _same(local, remote)
    named = [p for p in remote.problems if shard.name in p and "rank 0 step 1" in p]
    assert named and "truncated" in named[0]
    rows = remote.pairs_table.to_pylist()
    fallback = [r for r in rows if r["step"] == 1 and r["mode"] == "statistics"]
    assert fallback and all("tensor unreadable" in r["note"] for r in fallback)
    assert not [r for r in rows if r["step"] != 1 and r["mode"] == "statistics"]


def test_a_task_that_fails_on_every_try_names_its_shards(dumps, cluster, tmp_path):
    """The target's manifest breaks after this process opened the dump: every task fails on its
    workers (retried, then given up); its pairs fall back to statistics, each shard named."""
    import shutil

    from opscope.storage.reader import load

    target = load(shutil.copytree(dumps[0], tmp_path / "target"))  # opened here, as compare does first
    (target.path / "manifest.json").write_text("{ cut")
    result = compare(target, dumps[1], scheduler=cluster)
    rows = result.pairs_table.to_pylist()
    assert not [r for r in rows if r["mode"] == "tensor"]
    fallback = [r for r in rows if r["mode"] == "statistics"]
    assert fallback and all("not measured on the Dask cluster" in r["note"] for r in fallback)
    shards = {p.name for p in target.path.glob("rank0/step*/tensors-*.safetensors")}
    named = {shard for shard in shards if any(shard in problem for problem in result.problems)}
    assert named == shards and all("manifest.json" in p for p in result.problems if "Dask" in p)


def test_unreachable_scheduler_names_the_address(dumps):
    import dask

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), pytest.raises(ClusterError) as info:
        compare(*dumps, scheduler=f"tcp://127.0.0.1:{port}")
    assert f"tcp://127.0.0.1:{port}" in str(info.value) and "dask scheduler" in str(info.value)


def test_no_scheduler_file_or_address_says_what_to_give(dumps, tmp_path):
    with pytest.raises(ClusterError, match="dask scheduler --scheduler-file .*nowhere.json"):
        compare(*dumps, scheduler=str(tmp_path / "nowhere.json"))
    with pytest.raises(ClusterError, match="needs the scheduler's address"):
        compare(*dumps, scheduler="")  # not a cluster of Dask's own making in this process


def test_without_distributed_says_what_to_install(dumps, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # what the import meets when it is not installed
    with pytest.raises(ClusterError, match=r"pip install 'opscope\[dask\]'"):
        compare(*dumps, scheduler="tcp://127.0.0.1:8786")


def _can_unshare() -> bool:
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0 or not _can_unshare(),
                    reason="hiding a folder from one worker needs a mount namespace (root, unshare -m)")
def test_a_worker_that_does_not_see_the_dumps(dumps, cluster, scheduler_file):
    """A third worker, `dask worker` in its own mount namespace where a tmpfs hides the dumps'
    folder: the user is told which worker, which path, and that workers need a shared file system."""
    hidden = dumps[0].parent
    dask_cli = Path(sys.executable).with_name("dask")
    command = f"mount -t tmpfs none {hidden} && exec {dask_cli} worker --scheduler-file {scheduler_file} " \
              f"--nthreads 1 --no-nanny --no-dashboard --death-timeout 60 --local-directory {scheduler_file.parent}"
    worker = subprocess.Popen(["unshare", "-m", "sh", "-c", command],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cluster.wait_for_workers(3, timeout=120)
        workers = list(cluster.nthreads())
        with pytest.raises(ClusterError) as info:
            compare(*dumps, scheduler=str(scheduler_file))  # by the scheduler file, as `dask worker` found it
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    message = str(info.value)
    assert str(dumps[0]) in message and str(dumps[1]) in message and "shared file system" in message
    blind = [w for w in workers if w in message]
    assert len(blind) == 1  # only the third worker is named
