#!/usr/bin/env bash
# Stop the single-node Slurm cluster that tools/slurm/start.sh started: cancel the jobs still queued or
# running, then stop slurmd, slurmctld, slurmdbd, mariadbd (only if start.sh started it) and munged, each through
# the pid in its own pid file (never by process name). Safe to run when nothing is running.
set -uo pipefail
# The daemons and runuser live in sbin, which a minimal PATH (env -i, some CI runners) leaves out.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then exec sudo -n "$0" "$@"; fi
  echo "[slurm-stop] ERROR: run as root (or with passwordless sudo)" >&2
  exit 1
fi

stop_pidfile() { # stop_pidfile <pidfile> <name>
  local f=$1 name=$2 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null
      echo "[slurm-stop] $name (pid $pid) did not stop on SIGTERM: killed"
    else
      echo "[slurm-stop] stopped $name (pid $pid)"
    fi
  fi
  rm -f "$f"
}

if [ -s /run/slurmctld.pid ] && kill -0 "$(cat /run/slurmctld.pid)" 2>/dev/null; then
  jobs=$(squeue -h -o %i 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    echo "[slurm-stop] cancelling jobs: $(echo $jobs)"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi
stop_pidfile /run/slurmd.pid slurmd
for f in /run/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile "$f" "slurmd ($(basename "$f" .pid))"; done
stop_pidfile /run/slurmctld.pid slurmctld
stop_pidfile /run/slurmdbd.pid slurmdbd
# mariadbd only if start.sh started it (SLURM_WITH_DBD=1); a MariaDB of the system is left alone
if [ -s /run/amprepro-slurm-mariadbd.pid ] && [ "$(cat /run/amprepro-slurm-mariadbd.pid)" = "$(cat /run/mysqld/mysqld.pid 2>/dev/null)" ]; then
  stop_pidfile /run/mysqld/mysqld.pid mariadbd
fi
rm -f /run/amprepro-slurm-mariadbd.pid
stop_pidfile /run/munge/munged.pid munged
rm -rf /run/amprepro-fakegpu # the fake GPU device nodes start.sh made
echo "[slurm-stop] Slurm stopped"
