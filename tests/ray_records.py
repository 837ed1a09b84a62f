"""Print Ray's own records of a cluster as one JSON line: `python ray_records.py GCS_ADDRESS '{"what": [...]}'`.

A separate process, so the test process never joins a token-authenticated cluster itself. `what` holds any of
"nodes", "jobs", "tasks" (tasks: those named in "names", of the job whose driver pid is "driver_pid", or of
every job not listed in "not_jobs").
"""
from __future__ import annotations

import json
import sys

from ray.util.state import list_jobs, list_nodes, list_tasks


def main(address: str, query: dict) -> dict:
    out: dict = {}
    if "nodes" in query["what"]:
        out["nodes"] = [{"node_id": n.node_id, "ip": n.node_ip, "state": n.state, "is_head": n.is_head_node,
                         "cpus": (n.resources_total or {}).get("CPU", 0)} for n in list_nodes(address=address)]
    jobs = list_jobs(address=address)
    if "jobs" in query["what"]:
        out["jobs"] = [{"job_id": j.job_id, "pid": int(j.driver_info.pid) if j.driver_info else None,
                        "start_time": j.start_time, "runtime_env": j.runtime_env} for j in jobs]
    if "tasks" in query["what"]:
        wanted = [j.job_id for j in jobs if
                  (query.get("driver_pid") and j.driver_info and int(j.driver_info.pid) == query["driver_pid"])
                  or ("not_jobs" in query and j.job_id not in query["not_jobs"])]
        names = set(query.get("names") or ())
        tasks = []
        for job_id in wanted:
            tasks += [{"name": t.name, "state": t.state, "node_id": t.node_id, "job_id": job_id,
                       "runtime_env": t.runtime_env_info, "resources": t.required_resources}
                      for t in list_tasks(address=address, filters=[("job_id", "=", job_id)], detail=True,
                                          limit=10_000, raise_on_missing_output=False)
                      if not names or t.name in names]
        out["tasks"] = tasks
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2])), default=str))
