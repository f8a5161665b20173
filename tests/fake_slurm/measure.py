"""Run one job's command (`bash -c`) as the stand-in sbatch does, and write its wall time and the peak
resident memory of its largest process as JSON: measure.py USAGE_FILE COMMAND."""

import json
import os
import resource
import subprocess
import sys
import time

usage_file, command = sys.argv[1], sys.argv[2]
start = time.perf_counter()
code = subprocess.call(["bash", "-c", command])
wall = time.perf_counter() - start
peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: kilobytes, the largest descendant
with open(usage_file + ".tmp", "w") as f:
    json.dump({"wall_s": round(wall, 3), "max_rss_mb": round(peak_kb / 1024, 1), "exit": code}, f)
    f.write("\n")
os.replace(usage_file + ".tmp", usage_file)  # a reader never sees a half-written record
sys.exit(code)
