"""The Slurm tests need a running Slurm (tools/slurm/start.sh; CI: .ci/setup/20-slurm.sh)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slurm: runs jobs through a real Slurm (sbatch); skipped, with the reason, when none is running",
    )
