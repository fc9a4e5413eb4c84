"""Data-parallel training over MPI (kiln::dist_mpi) against one process, and failure drills.

Run by ctest (Dist.Mpi) with KILN_DP_TRAIN, KILN, MPIRUN and KILN_DIGITS_DIR set.
"""
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

DP_TRAIN = os.environ.get("KILN_DP_TRAIN", "")
KILN = os.environ.get("KILN", "")
MPIRUN = os.environ.get("MPIRUN", "mpirun")
DATA = os.environ.get("KILN_DIGITS_DIR", "build/data")
STEPS = 40
BATCH = 32

pytestmark = pytest.mark.skipif(not DP_TRAIN, reason="KILN_DP_TRAIN is not set (run through ctest)")


def mpi_env(extra=None):
    env = dict(os.environ)
    # containers: no ptrace-based single copy, no core binding, root allowed (CI runs as root)
    env.update({
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "KILN_THREADS": "1",
    })
    env.update(extra or {})
    return env


def mpirun(n, args, timeout=300, extra_env=None):
    cmd = [MPIRUN, "-np", str(n), "--bind-to", "none", DP_TRAIN, "--data", DATA] + args
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env(extra_env))
    return p, time.monotonic() - t0


def losses(path):
    return np.loadtxt(path, ndmin=1)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "losses.txt"
    p = subprocess.run([DP_TRAIN, "--data", DATA, "--transport", "none", "--steps", str(STEPS),
                        "--global-batch", str(BATCH), "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=mpi_env())
    assert p.returncode == 0, p.stderr
    return losses(out)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_data_parallel_matches_one_process_with_the_combined_batch(single, tmp_path, ranks):
    out = tmp_path / "losses.txt"
    p, _ = mpirun(ranks, ["--transport", "mpi", "--steps", str(STEPS), "--global-batch", str(BATCH),
                          "--out", str(out)])
    assert p.returncode == 0, p.stdout + p.stderr
    got = losses(out)
    assert got.shape == single.shape
    # the same trajectory: float sums over ranks round differently from one batch's sums
    np.testing.assert_allclose(got, single, rtol=2e-4, atol=1e-5)
    # and it trained
    assert got[-5:].mean() < 0.5 * got[:5].mean()


def test_steps_on_a_kiln_queue_give_the_same_trajectory(single, tmp_path):
    # the steps and their all-reduces run asynchronously on a Queue, ordered by an Event
    out = tmp_path / "losses.txt"
    p, _ = mpirun(2, ["--transport", "mpi", "--queue", "--steps", str(STEPS), "--global-batch",
                      str(BATCH), "--out", str(out)])
    assert p.returncode == 0, p.stdout + p.stderr
    np.testing.assert_allclose(losses(out), single, rtol=2e-4, atol=1e-5)


def test_rank_zero_writes_the_checkpoint(tmp_path):
    ckpt = tmp_path / "step10.kiln"
    p, _ = mpirun(2, ["--transport", "mpi", "--steps", "12", "--checkpoint", str(ckpt),
                      "--checkpoint-step", "10"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert ckpt.exists()
    leftovers = [f for f in tmp_path.iterdir() if f.name != ckpt.name]
    assert leftovers == []
    info = subprocess.run([KILN, "inspect", str(ckpt)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert "conv1.weight" in info.stdout


def drill(flag, timeout_seconds):
    """Rank 1 fails at step 5 as `flag` says; the job must end with an error within a minute."""
    p, seconds = mpirun(2, ["--transport", "mpi", "--steps", "1000", flag, "1", "--fail-step", "5"],
                        timeout=120, extra_env={"KILN_DIST_TIMEOUT": str(timeout_seconds)})
    assert p.returncode != 0
    assert seconds < 60
    return p.stdout + p.stderr


def test_a_killed_rank_ends_the_job_instead_of_hanging():
    text = drill("--kill-rank", 10)
    assert "dying at step 5" in text
    # mpirun names the dead rank, or kiln's timeout does on the survivor
    assert ("signal 9" in text) or ("Killed" in text) or ("did not complete within" in text), text


def test_a_hung_rank_times_out_with_a_clear_error():
    text = drill("--hang-rank", 3)
    assert "did not complete within 3.0 s on rank 0 of 2" in text, text
    assert "another rank died, hung" in text


def test_kiln_launch_stops_the_other_ranks_when_one_fails():
    script = 'echo "rank $KILN_RANK of $KILN_WORLD_SIZE"; [ "$KILN_RANK" = 1 ] && sleep 1 && exit 3; sleep 60'
    t0 = time.monotonic()
    p = subprocess.run([KILN, "launch", "-n", "3", "--grace", "1", "--", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3
    assert time.monotonic() - t0 < 30
    assert "rank 1 exited with status 3" in p.stderr
    assert sorted(l for l in p.stdout.splitlines() if l.startswith("rank")) == [
        "rank 0 of 3", "rank 1 of 3", "rank 2 of 3"]


def test_kiln_launch_gives_each_rank_its_environment(tmp_path):
    script = f'echo "$KILN_RANK $KILN_LOCAL_RANK $KILN_WORLD_SIZE $KILN_RENDEZVOUS" > {tmp_path}/r$KILN_RANK'
    p = subprocess.run([KILN, "launch", "-n", "2", "--", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    r0 = (tmp_path / "r0").read_text().split()
    r1 = (tmp_path / "r1").read_text().split()
    assert r0[:3] == ["0", "0", "2"] and r1[:3] == ["1", "1", "2"]
    assert r0[3] == r1[3] and r0[3].startswith("file:")
    # the rendezvous folder is removed afterwards
    assert not pathlib.Path(r0[3][5:]).exists()


@pytest.mark.parametrize("ranks", [1, 3])
def test_every_collective_matches_its_reference(ranks):
    p, _ = mpirun(ranks, ["--transport", "mpi", "--selftest"], timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"selftest passed: every collective on {ranks} rank(s) of mpi" in p.stdout


def test_a_rank_that_leaves_early_does_not_hang_the_others():
    text = drill("--exit-rank", 3)
    assert "leaving early at step 5" in text
    assert "did not complete within 3.0 s" in text, text
