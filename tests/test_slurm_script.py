"""The Slurm script shown in notebook 10 is a valid bash script that runs our DDP script."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm_ddp.sbatch"


def test_slurm_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_slurm_script_launches_torchrun_with_a_c10d_rendezvous():
    text = SCRIPT.read_text()
    for part in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "srun torchrun",
                 "--rdzv-backend=c10d", '--rdzv-endpoint="$HEAD_NODE:$PORT"',
                 '--rdzv-id="$SLURM_JOB_ID"', "-m helpers.ddp_train"):
        assert part in text, part
