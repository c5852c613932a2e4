#!/usr/bin/python3
"""measure.py CMD [ARG...]: run CMD and print "WALL USER SYS PEAK_KIB" on stdout.

WALL is the elapsed time in seconds, USER and SYS the CPU time of CMD and its threads
(from wait4), PEAK_KIB the largest private memory (RssAnon: RSS minus file-backed and
shared pages) seen in /proc every 5 ms.  CMD's own output goes where this script's
goes; a failing CMD fails this script with its status.  Used by tests/bench.sh.
"""
import os
import subprocess
import sys
import time


def rss_anon_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    start = time.monotonic()
    child = subprocess.Popen(sys.argv[1:])
    peak = 0
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid != 0:
            break
        peak = max(peak, rss_anon_kib(child.pid))
        time.sleep(0.005)
    wall = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(code if code > 0 else 128 - code)
    print(f"{wall:.3f} {usage.ru_utime:.3f} {usage.ru_stime:.3f} {peak}")


if __name__ == "__main__":
    main()
