#!/usr/bin/env bash
# Start a real single-node Slurm cluster on this machine (Debian/Ubuntu `slurm-wlm` + `munge`), for testing
# amprepro's Slurm profile (profiles/slurm) without a cluster. No systemd needed. Run as root (or with sudo).
#
#   tools/slurm/start.sh          # install if missing, write the config, start munged + slurmctld + slurmd,
#                                 # wait until the node is idle, run one sbatch smoke job
#   tools/slurm/stop.sh           # stop it again (by pid, nothing broader)
#
# Idempotent: when the daemons are already running with the same config, it only checks the node is up
# (running jobs survive). When the config changed, it restarts the daemons.
#
# The node is a *fake GPU node*: it advertises SLURM_FAKE_GPUS gres GPUs (File= points at character devices
# with /dev/null's driver, made in /run/amprepro-fakegpu, so slurmd can count them) and, through
# SlurmdParameters=config_overrides, more CPUs and memory than the machine has, so the GPU-node requests in
# profiles/slurm schedule unchanged. Nothing is enforced (no cgroups): jobs share the real cores.
#
# Knobs (environment):
#   SLURM_FAKE_GPUS=8         fake GPUs per node (0..16 in all), like one 8-GPU node
#   SLURM_NODES=1             node daemons on this host (1..4). 2 gives a two-node cluster on one machine:
#                             nodes <host>-n1, <host>-n2, one slurmd each (slurmd -N, own port, spool, pid and
#                             log file), both reached at 127.0.0.1, for multi-node cells (tests/slurm)
#   SLURM_FAKE_GPU_TYPE=fake  gres type name; set it to the gpu_model you put in profiles/slurm (e.g. h100)
#   SLURM_PARTITION=debug     name of the (default) partition; add SLURM_EXTRA_PARTITIONS="gpu cpu" for more
#   SLURM_NODE_CPUS=128       CPUs the node advertises (at least the real count)
#   SLURM_NODE_MEM_MB=1048576 memory the node advertises (8 GPU jobs of profiles/slurm need 8 x 64000 MB)
#   SLURM_MIN_JOB_AGE=600     seconds finished jobs stay visible to squeue/scontrol (status command squeue)
#   SLURM_WITH_DBD=0          1 = also start MariaDB + slurmdbd, so `sacct` (the plugin's default) works
#   SLURM_SKIP_APT=0          1 = never call apt-get
#   SLURM_SMOKE=1             0 = skip the sbatch smoke job
#   SLURM_WAIT_S=60           how long to wait for the node to become idle
#   SLURM_FORCE=0             1 = overwrite an /etc/slurm/slurm.conf this script did not write
# Exit status: 0 when the node is idle (and the smoke job completed); non-zero with the daemons' logs otherwise.
set -euo pipefail
# The daemons and runuser live in sbin, which a minimal PATH (env -i, some CI runners) leaves out.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

FAKE_GPUS="${SLURM_FAKE_GPUS:-8}"
GPU_TYPE="${SLURM_FAKE_GPU_TYPE:-fake}"
PARTITION="${SLURM_PARTITION:-debug}"
EXTRA_PARTITIONS="${SLURM_EXTRA_PARTITIONS:-}"
CLUSTER="${SLURM_CLUSTER:-amprepro}"
MIN_JOB_AGE="${SLURM_MIN_JOB_AGE:-600}"
WITH_DBD="${SLURM_WITH_DBD:-0}"
WAIT_S="${SLURM_WAIT_S:-60}"
LOGDIR=/var/log/slurm
CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
MARKER="# written by amprepro tools/slurm/start.sh"
FAKE_DEV_DIR=/run/amprepro-fakegpu
OWN_MARIADB=/run/amprepro-slurm-mariadbd.pid
T0=$(date +%s)

log() { echo "[slurm-start +$(($(date +%s) - T0))s] $*"; }
die() {
  echo "[slurm-start] ERROR: $*" >&2
  for f in "$LOGDIR/slurmctld.log" "$LOGDIR"/slurmd*.log "$LOGDIR/slurmdbd.log"; do
    [ -s "$f" ] && { echo "--- last lines of $f" >&2; tail -n 25 "$f" >&2; }
  done
  exit 1
}

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n --preserve-env=SLURM_NODES,SLURM_FAKE_GPUS,SLURM_FAKE_GPU_TYPE,SLURM_PARTITION,SLURM_EXTRA_PARTITIONS,SLURM_CLUSTER,SLURM_NODE_CPUS,SLURM_NODE_MEM_MB,SLURM_MIN_JOB_AGE,SLURM_WITH_DBD,SLURM_SKIP_APT,SLURM_SMOKE,SLURM_WAIT_S,SLURM_FORCE "$0" "$@"
  fi
  die "run as root (or with passwordless sudo): it installs packages and starts system daemons"
fi
NODES="${SLURM_NODES:-1}"
case "$NODES" in [1-4]) ;; *) die "SLURM_NODES must be 1..4 (got '$NODES')" ;; esac
case "$FAKE_GPUS" in [0-9] | 1[0-6]) ;; *) die "SLURM_FAKE_GPUS must be 0..16 (got '$FAKE_GPUS')" ;; esac
[ $((FAKE_GPUS * NODES)) -le 16 ] || die "SLURM_FAKE_GPUS x SLURM_NODES must be at most 16 (got $FAKE_GPUS x $NODES)"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_pidfile() { # stop only the process whose pid is in file $1; wait up to 10 s, then SIGKILL that pid
  local f=$1 pid
  alive "$f" || { rm -f "$f"; return 0; }
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}
wait_for() { # wait_for <seconds> <command...>
  local secs=$1; shift
  for _ in $(seq 1 $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

# ------------------------------------------------------------------ 1. packages
if [ "${SLURM_SKIP_APT:-0}" != 1 ]; then
  pkgs=(slurm-wlm munge)
  [ "$WITH_DBD" = 1 ] && pkgs+=(slurmdbd mariadb-server)
  missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get update -qq || die "apt-get update failed"
    # Without systemd the postinst scripts cannot start services (policy-rc.d or no init): we start them below.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get install ${missing[*]} failed"
  fi
fi
for b in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd sbatch sinfo squeue scontrol; do
  command -v "$b" >/dev/null || die "$b not found: install slurm-wlm and munge (or drop SLURM_SKIP_APT=1)"
done
getent passwd slurm >/dev/null || die "no 'slurm' user: the slurm-wlm packages did not install cleanly"

# ------------------------------------------------------------------ 2. the config
NODE=$(hostname -s)
if [ "$NODES" = 1 ]; then
  NODE_NAMES=("$NODE")
  SLURMD_FILES="SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmdPidFile=/run/slurmd.pid
SlurmdLogFile=$LOGDIR/slurmd.log"
else
  NODE_NAMES=()
  for n in $(seq 1 "$NODES"); do NODE_NAMES+=("$NODE-n$n"); done
  SLURMD_FILES="SlurmdSpoolDir=/var/lib/slurm/slurmd-%n
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdLogFile=$LOGDIR/slurmd-%n.log"
fi
slurmd_pidfile() { if [ "$NODES" = 1 ]; then echo /run/slurmd.pid; else echo "/run/slurmd-$1.pid"; fi; }
REAL_CPUS=$(nproc)
NODE_CPUS="${SLURM_NODE_CPUS:-128}"
[ "$NODE_CPUS" -ge "$REAL_CPUS" ] || NODE_CPUS=$REAL_CPUS
NODE_MEM_MB="${SLURM_NODE_MEM_MB:-1048576}"
GRES_NODE=""
GRES_LINES=""
if [ "$FAKE_GPUS" -gt 0 ]; then
  # gres/gpu needs File= pointing at existing *character devices*: with no File the node reports 0 GPUs and
  # goes INVAL; with regular files the jobs schedule but CUDA_VISIBLE_DEVICES comes out empty. So: one
  # character device per fake GPU, with /dev/null's driver (1,3): reads are empty, writes vanish.
  # Without mknod (a container without CAP_MKNOD), fall back to the character devices every system has.
  mkdir -p "$FAKE_DEV_DIR"
  fallback=(/dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty /dev/ptmx)
  i=0
  for name in "${NODE_NAMES[@]}"; do
    for _ in $(seq 1 "$FAKE_GPUS"); do
      dev="$FAKE_DEV_DIR/gpu$i"
      if [ ! -c "$dev" ] && ! mknod -m 666 "$dev" c 1 3 2>/dev/null; then
        [ "$i" -lt ${#fallback[@]} ] || die "mknod is not allowed here: at most ${#fallback[@]} fake GPUs (SLURM_FAKE_GPUS)"
        dev=${fallback[$i]}
      fi
      GRES_LINES+="NodeName=$name Name=gpu Type=$GPU_TYPE File=$dev"$'\n'
      i=$((i + 1))
    done
  done
  GRES_NODE="Gres=gpu:$GPU_TYPE:$FAKE_GPUS"
fi
if [ "$WITH_DBD" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
PARTITION_LINES="PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
for p in $EXTRA_PARTITIONS; do
  [ "$p" = "$PARTITION" ] || PARTITION_LINES+=$'\n'"PartitionName=$p Nodes=ALL Default=NO MaxTime=INFINITE State=UP"
done

if [ "$NODES" = 1 ]; then
  NODE_LINES="NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB $GRES_NODE State=UNKNOWN"
else # several slurmd on this host: each its own name and port, all reached at 127.0.0.1
  NODE_LINES=""
  for n in $(seq 1 "$NODES"); do
    NODE_LINES+="NodeName=$NODE-n$n NodeHostname=$NODE NodeAddr=127.0.0.1 Port=$((17000 + n)) CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB $GRES_NODE State=UNKNOWN"$'\n'
  done
  NODE_LINES=${NODE_LINES%$'\n'}
fi
NEW_CONF=$(
  cat <<EOF
$MARKER
# Single-node test cluster: one fake GPU node ($NODE), nothing enforced (no cgroups, no accounting unless DBD).
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=slurm
SlurmdUser=root
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmctldPidFile=/run/slurmctld.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
$SLURMD_FILES
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, a job that does not ask for memory gets the whole node and blocks every other job.
DefMemPerCPU=500
# Trust the node sizes below even though the machine is smaller (lets GPU-node requests schedule).
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible to squeue --states=all / scontrol for this long (status command squeue needs it).
MinJobAge=$MIN_JOB_AGE
$ACCT
# Every finished job is appended here (Slurm's own record; works without slurmdbd).
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGDIR/jobcomp.log
GresTypes=gpu
$NODE_LINES
$PARTITION_LINES
EOF
)

if [ -e "$CONF" ] && ! head -n 1 "$CONF" | grep -qF "$MARKER" && [ "${SLURM_FORCE:-0}" != 1 ]; then
  die "$CONF exists and was not written by this script; refusing to overwrite it (SLURM_FORCE=1 to do it anyway)"
fi

changed=0
if [ ! -e "$CONF" ] || [ "$(cat "$CONF")" != "$NEW_CONF" ]; then changed=1; fi
if [ "$(cat "$GRES_CONF" 2>/dev/null || true)" != "${GRES_LINES%$'\n'}" ]; then changed=1; fi
mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd "$LOGDIR"
for name in "${NODE_NAMES[@]}"; do mkdir -p "/var/lib/slurm/slurmd-$name"; done
chown slurm:slurm /var/lib/slurm/slurmctld "$LOGDIR"
if [ "$changed" = 1 ]; then
  printf '%s\n' "$NEW_CONF" >"$CONF"
  if [ -n "$GRES_LINES" ]; then printf '%s' "$GRES_LINES" >"$GRES_CONF"; else rm -f "$GRES_CONF"; fi
  log "wrote $CONF ($NODE: $NODE_CPUS CPUs, $NODE_MEM_MB MB, $FAKE_GPUS fake GPU(s) of type '$GPU_TYPE', partition $PARTITION)"
fi

# ------------------------------------------------------------------ 3. munge
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key --force
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 755 /run/munge
if ! alive /run/munge/munged.pid; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged || die "munged did not start"
fi
wait_for 10 sh -c 'munge -n | unmunge' || die "munge does not answer (munge -n | unmunge)"

# ------------------------------------------------------------------ 4. (optional) MariaDB + slurmdbd
if [ "$WITH_DBD" = 1 ]; then
  mkdir -p /run/mysqld
  chown mysql:mysql /run/mysqld
  if ! mysqladmin ping >/dev/null 2>&1; then
    log "starting mariadbd"
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    nohup /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --pid-file=/run/mysqld/mysqld.pid \
      --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 >"$LOGDIR/mariadbd.log" 2>&1 &
    echo $! >"$OWN_MARIADB" # stop.sh stops mariadbd only when this script started it
    wait_for 60 mysqladmin ping || die "mariadbd did not come up (see $LOGDIR/mariadbd.log)"
  fi
  mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmlocal';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat >/etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
PidFile=/run/slurmdbd.pid
LogFile=$LOGDIR/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=slurm
StoragePass=slurmlocal
StorageLoc=slurm_acct_db
EOF
  chown slurm:slurm /etc/slurm/slurmdbd.conf
  chmod 600 /etc/slurm/slurmdbd.conf
  if ! alive /run/slurmdbd.pid; then
    log "starting slurmdbd"
    /usr/sbin/slurmdbd || die "slurmdbd did not start"
  fi
  wait_for 60 sacctmgr -n show cluster || die "slurmdbd does not answer (sacctmgr show cluster)"
  sacctmgr -n show cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

if [ "$WITH_DBD" != 1 ] && alive /run/slurmdbd.pid; then
  log "stopping slurmdbd (not wanted: SLURM_WITH_DBD=0)"
  stop_pidfile /run/slurmdbd.pid
fi

# ------------------------------------------------------------------ 5. slurmctld + slurmd
node_ok() { # every node of this config is up
  local name
  for name in "${NODE_NAMES[@]}"; do
    sinfo -h -n "$name" -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)$' || return 1
  done
}
slurmds_alive() {
  local name
  for name in "${NODE_NAMES[@]}"; do alive "$(slurmd_pidfile "$name")" || return 1; done
}
if [ "$changed" = 0 ] && alive /run/slurmctld.pid && slurmds_alive && node_ok; then
  log "already running with this config: $(sinfo -h -o '%P %T %N %c CPUs %m MB %G' | head -n 1)"
else
  for f in /run/slurmd.pid /run/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
  stop_pidfile /run/slurmctld.pid
  log "starting slurmctld + ${#NODE_NAMES[@]} slurmd"
  /usr/sbin/slurmctld -c || die "slurmctld did not start" # -c: start from a clean state (no old jobs/nodes)
  if [ "$NODES" = 1 ]; then
    /usr/sbin/slurmd || die "slurmd did not start"
  else
    for name in "${NODE_NAMES[@]}"; do /usr/sbin/slurmd -N "$name" || die "slurmd -N $name did not start"; done
  fi
fi
if ! wait_for "$WAIT_S" node_ok; then
  sinfo -N -l >&2 || true
  scontrol show node >&2 || true
  die "nodes ${NODE_NAMES[*]} did not become idle within ${WAIT_S}s"
fi
log "cluster up: $(sinfo -h -o '%P %a %T %N %c CPUs %m MB %G' | tr '\n' ' ')"

# ------------------------------------------------------------------ 6. smoke job through sbatch
if [ "${SLURM_SMOKE:-1}" = 1 ]; then
  out=$(mktemp /tmp/amprepro-slurm-smoke.XXXXXX)
  gpu_arg=()
  [ "$FAKE_GPUS" -gt 0 ] && gpu_arg=(--gpus=$((FAKE_GPUS > 1 ? 2 : 1)))
  jid=$(sbatch --parsable -J amprepro-smoke -t 1 --mem 100 "${gpu_arg[@]}" -o "$out" \
    --wrap 'echo "host=$(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"') || die "sbatch refused the smoke job"
  job_done() { scontrol show job "$jid" | grep -qE 'JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)'; }
  wait_for 60 job_done || die "smoke job $jid did not finish within 60 s: $(scontrol show job "$jid" | grep -o 'JobState=[A-Z_]* Reason=[^ ]*')"
  scontrol show job "$jid" | grep -q 'JobState=COMPLETED' || die "smoke job $jid: $(scontrol show job "$jid")"
  log "smoke job $jid completed: $(cat "$out")"
  rm -f "$out"
fi
log "ready"
