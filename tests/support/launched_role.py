"""A stand-in for a role's main, run by the fork server's tests as ``python -m``: it writes
what it was started with (one JSON line), then exits with the code given as its argument,
or sleeps until a signal ends it when the argument is "sleep"."""

import json
import os
import sys
import time

if __name__ == "__main__":
    with open(f"/proc/{os.getpid()}/comm") as comm:
        name = comm.read().strip()
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "ppid": os.getppid(),
                      "name": name, "hash": hash("gearbus"), "stdin": sys.stdin.read(),
                      "safe_path": sys.flags.safe_path, "main": __name__}))
    if sys.argv[1] == "sleep":
        time.sleep(600)
    sys.exit(int(sys.argv[1]))
