#!/usr/bin/env bash
# A real single-node Slurm on localhost (Debian slurm-wlm + munge, fake GPU gres) for tests/slurm, which runs the
# smoke preset through `--workflow-profile profiles/slurm`. Installs the packages if missing, starts the daemons
# (idempotent), and fails loudly, with the daemons' logs, when the node does not come up or a job does not run.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Two node daemons on this host: tests/slurm runs a two-node cell (SLURM_NODES, tools/slurm/start.sh).
# Finished jobs stay in squeue/scontrol for 30 min (start.sh's default: 10): the tests read every job's record right
# after each run, and the two Slurm runs side by side (make test's two workers) can each take more than 10 minutes.
SLURM_NODES=2 SLURM_SMOKE=1 SLURM_MIN_JOB_AGE=1800 bash tools/slurm/start.sh

# Belt and braces: the test is skipped when Slurm is not usable, so make sure here that it is.
sinfo -h -o '%T %G' | grep -qE '^(idle|mixed).*gpu' || {
  echo "ERROR: Slurm started but no idle node with GPU gres:" >&2
  sinfo -N -l >&2 || true
  exit 1
}
echo "slurm ready: $(sinfo -h -o '%P %T %N %c CPUs %m MB %G' | head -n 1)"
