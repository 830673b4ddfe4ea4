"""Which launcher started this process, from its environment alone (replay/mpi.py): Open MPI's mpirun, a PMI
(MPICH/Hydra, Intel MPI), Slurm's srun with or without a PMI plugin, and a Slurm batch script, which is no rank."""

import pytest

from replay import mpi

LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK", "PMI_FD", "PMIX_RANK")
SLURM_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.mark.parametrize(
    "env, size, rank, problem",
    [
        ({}, 1, 0, False),
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}, 4, 3, False),
        ({"PMI_SIZE": "2", "PMI_RANK": "1"}, 2, 1, False),
        # srun --mpi=pmix: the task count and index from Slurm, MPI from PMIx
        ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "PMIX_RANK": "1"}, 2, 1, False),
        # srun --mpi=none: MPI_Init would abort; refused before it
        ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}, 2, 0, True),
        # the batch script of `sbatch -N2`: SLURM_NTASKS is the allocation's, the script itself is one process
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, 1, 0, False),
        # mpirun inside an allocation: its ranks carry Open MPI's variables beside Slurm's step of its daemons
        ({"SLURM_STEP_NUM_TASKS": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}, 4, 2, False),
        ({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}, 1, 0, False),
    ],
)
def test_size_rank_and_what_is_refused(monkeypatch, env, size, rank, problem):
    for var in LAUNCHER_VARS + SLURM_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert mpi.world_size() == size and mpi.env_int(mpi.RANK_ENV, 0) == rank
    said = mpi.launch_problem()
    assert (said is not None) == problem
    if problem:
        assert "srun --mpi=pmix" in said and "\n" not in said
