"""Sample /proc every 0.5 s until STOPFILE exists: per process (pid and start time) its own CPU seconds (utime + stime,
its children not counted) as last seen, its command line, working directory and parent. A process shorter than the
interval can be missed. Usage: python tools/ci/cpusample.py OUT.json STOPFILE &, then the run, then touch STOPFILE."""

import json
import os
import sys
import time


def sample(seen: dict, tick: int) -> None:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        rest = stat.rpartition(")")[2].split()
        cpu = (int(rest[11]) + int(rest[12])) / tick
        record = seen.setdefault(f"{name}:{rest[19]}", {"pid": int(name), "ppid": int(rest[1]),
                                                         "comm": stat[stat.find("(") + 1:stat.rfind(")")],
                                                         "cmd": command(name), "cwd": cwd(name), "cpu": cpu,
                                                         "t0": time.time()})
        record["cpu"] = max(record["cpu"], cpu)
        record["t1"] = time.time()


def command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")[:400]
    except OSError:
        return ""


def cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def main() -> None:
    out, stop = sys.argv[1], sys.argv[2]
    tick, seen = os.sysconf("SC_CLK_TCK"), {}
    while not os.path.exists(stop):
        sample(seen, tick)
        time.sleep(0.5)
    with open(out, "w") as handle:
        json.dump(list(seen.values()), handle)


if __name__ == "__main__":
    main()
