"""The Slurm script shown in notebook 18 is a valid bash script that runs notebook 16's DDP
script."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.notebook_scripts import write_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm_ddp.sbatch"


def test_slurm_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_slurm_script_launches_torchrun_with_a_c10d_rendezvous():
    text = SCRIPT.read_text()
    for part in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "srun torchrun",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$HEAD_NODE:$PORT"',
        '--rdzv-id="$SLURM_JOB_ID"',
        '"$SCRIPT" --batch',
    ):
        assert part in text, part


def test_the_arguments_it_passes_are_the_scripts_own(tmp_path):
    """The arguments after "$SCRIPT" parse with notebook 16's script's own argument parser."""
    text = SCRIPT.read_text()
    assert 'SCRIPT=$(realpath "${1:?' in text
    args = text.split('"$SCRIPT"', 1)[1].split()
    script = write_script("16_ddp.ipynb", "TRAIN_PY", tmp_path / "train_ddp.py").read_text()
    parser = script[: script.index("a = p.parse_args()")] + "a = p.parse_args(ARGS)\n"
    scope = {"ARGS": args}
    exec(compile(parser, "train_ddp.py", "exec"), scope)  # imports and the parser, no training
    assert scope["a"].batch == 256 and scope["a"].epochs == 2
