"""Two machines of one process each, simulated on localhost: two ``accelerate launch`` commands with
examples/accelerate_configs/multi_node.yaml (DeepSpeed ZeRO-2, ``deepspeed_multinode_launcher: standard``, so each
machine's launcher starts its own process), ``--machine_rank`` 0 and 1, one rendezvous on 127.0.0.1, gloo on CPU.
With one output directory for both (as a shared filesystem gives): checkpoints hold both machines' state, and both
machines SIGKILLed after a checkpoint and restarted end byte-identical to the uninterrupted run. With a directory of
each machine's own (the same relative output_dir under two working directories, as two local disks would give): the
run refuses to start, naming output_dir."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile

import psutil
import pytest
from conftest import CONFIGS, TOY_RUN, TWO_PROCESSES, free_port, read_logs

from integration.errors.error_table import matches, table_rows
from integration.resume.test_resume import assert_same_result
from steadyrl.checkpoint import verify_checkpoint
from steadyrl.checkpoint.shared_dir import DirectoryView, not_shared_error

MULTI_NODE = CONFIGS / "multi_node.yaml"


def launch_machines(output_dir, *flags, cwds=(None, None), expect="success") -> list[str]:
    """support/toy_run.py on two simulated machines (one launcher each, started together, in ``cwds``); return each
    one's output. ``expect``: "success", "kill" (both SIGKILLed after a checkpoint) or "failure"."""
    port, procs = free_port(), []
    logs = [tempfile.TemporaryFile("w+") for _ in cwds]  # not pipes: a full one would stall its machine
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        for rank, (cwd, log) in enumerate(zip(cwds, logs)):
            cmd = [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--config_file",
                str(MULTI_NODE),
                "--num_machines",
                "2",
                "--machine_rank",
                str(rank),
                "--num_processes",
                "2",
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                str(port),
                "--mixed_precision",
                "no",
                str(TOY_RUN),
                str(output_dir),
                *flags,
                *TWO_PROCESSES,
            ]
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))
        for proc in procs:
            proc.wait(timeout=300)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
    finally:
        for proc in procs:  # a machine left waiting for the other: its launcher and its worker (in its own session)
            if proc.poll() is None:
                for process in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
                proc.wait()
        for log in logs:
            log.close()
    for rank, (proc, output) in enumerate(zip(procs, outputs)):
        tail = f"machine {rank} exited with {proc.returncode}:\n{output[-3000:]}"
        if expect == "success":
            assert proc.returncode == 0, tail
        elif expect == "kill":  # the launcher reports its killed worker as a failure
            assert proc.returncode != 0 and "Signal 9" in output, tail
        else:
            assert proc.returncode != 0, tail
    return outputs


def worker_tracebacks(output: str) -> list[str]:
    """The lines that start a traceback, except in torchrun's own exit-barrier error record: the agent of a machine
    other than 0 may find machine 0's agent (the store's host) already gone when both runs have finished
    (pytorch/pytorch#69520; the launcher still exits 0)."""
    lines = output.splitlines()
    barrier_records = {line.split("]", 1)[0] for line in lines if "Error waiting on exit barrier" in line}
    return [line for line in lines if "Traceback" in line and line.split("]", 1)[0] not in barrier_records]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, toy_path):
    out = tmp_path_factory.mktemp("multinode")
    return out, launch_machines(out)


def test_a_run_over_two_machines_checkpoints_the_state_of_both(uninterrupted):
    out, outputs = uninterrupted
    assert sorted(read_logs(out)) == list(range(1, 13))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (12, 3, 6, 9)]
    manifest = verify_checkpoint(out / "checkpoint-6")  # mid-rollout: each machine saved its share of it
    assert manifest["processes"] == 2
    for rank in (0, 1):
        per_rank = {
            f"optimizer_{rank}.pt",
            f"rng_state_{rank}.json",
            f"meter_{rank}.json",
            f"rollout_buffer_{rank}.safetensors",
            f"rollout_buffer_{rank}.json",
        }
        assert per_rank <= set(manifest["files"]), rank
    # nothing of the run's ownership is left: the lock (taken by the main process only) and the shared-directory mark
    assert not [p.name for p in out.iterdir() if p.name.startswith(".steadyrl")]
    for output in outputs:
        assert not worker_tracebacks(output), output[-6000:]


def test_both_machines_killed_after_a_checkpoint_resume_identically(uninterrupted, tmp_path):
    out, _ = uninterrupted
    launch_machines(tmp_path, "--kill-after-save", "6", expect="kill")
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    outputs = launch_machines(tmp_path, "--resume")
    for output in outputs:  # each machine loads its own process's state from the shared checkpoint
        assert "Resuming from" in output and "checkpoint-6" in output
    assert_same_result(out, tmp_path, after_step=6)


def test_without_a_shared_output_dir_the_run_refuses_to_start(tmp_path, toy_path):
    # output_dir "out" relative to each machine's working directory: the same path, two directories, as two local
    # disks would give
    cwds = [tmp_path / "machine-0", tmp_path / "machine-1"]
    for cwd in cwds:
        cwd.mkdir()
    outputs = launch_machines("out", cwds=cwds, expect="failure")
    expected = table_rows()["output-dir-not-shared"]
    for output in outputs:  # both processes raise it (the launcher prefixes each line with "[rank<N>]: ")
        errors = [line.split("shared_dir.", 1)[1] for line in output.splitlines() if "shared_dir.OutputDir" in line]
        assert errors, output[-3000:]
        assert matches(expected, errors[-1]), errors[-1]
    for cwd in cwds:  # no step ran, nothing is left behind
        assert sorted(p.name for p in (cwd / "out").iterdir()) == [], cwd


def test_the_error_names_the_processes_that_cannot_see_output_dir():
    # an absolute output_dir on each machine's local disk: the same path everywhere, one process per machine
    views = [DirectoryView(rank, f"node{rank}", "/data/out", rank in (0, 3)) for rank in range(8)]
    message = str(not_shared_error("/data/out", views))
    assert message.startswith(
        "output_dir='/data/out' is not one directory shared by every process: process 0 on "
        "host node0 created a file in it that process 1 on host node1, process 2 on host node2, "
        "process 4 on host node4, process 5 on host node5 and 2 more cannot see."
    )
    assert not_shared_error("/data/out", [DirectoryView(r, "node0", "/data/out", True) for r in range(2)]) is None
