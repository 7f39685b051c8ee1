#!/usr/bin/env python3
"""One line of numbers from a run directory, for scripts/gpu_job_check.sh:
training steps per second (between the first and last metrics lines), the
learner's trained tokens per second, and the weight-sync rates as learner 0
published and the actors received them (their last reported values).
Rates are the publication's bytes over its time from publish() to the last
bucket: with small models they measure latency more than bandwidth."""
import json
import sys
from pathlib import Path


def main(run_dir: str) -> str:
    lines = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    if len(lines) < 2:
        return "fewer than 2 metrics lines"
    first, last = lines[0], lines[-1]
    seconds = (last["time_ms"] - first["time_ms"]) / 1000.0
    steps = last["step"] - first["step"]
    roles = last.get("roles", {})

    def value(role, kind, name):
        return roles.get(role, {}).get(kind, {}).get(name)

    parts = [f"{steps / seconds:.2f} steps/s" if seconds > 0 else "steps/s n/a"]
    tokens = value("learner", "counters", "learner.trained_tokens")
    first_tokens = first.get("roles", {}).get("learner", {}).get("counters", {}).get("learner.trained_tokens")
    if tokens is not None and first_tokens is not None and seconds > 0:
        parts.append(f"{(tokens - first_tokens) / seconds:.0f} trained tokens/s")
    # Learner 0 publishes (the role's gauge averages every learner); the actors' mean is right.
    learner0 = next((r for r in last.get("ranks", []) if r.get("rank") == 0), {})
    publish = learner0.get("gauges", {}).get("sync.publish_GB_per_s")
    receive = value("actor", "gauges", "sync.receive_GB_per_s")
    if publish is not None:
        parts.append(f"sync publish {publish:.3g} GB/s")
    if receive is not None:
        parts.append(f"sync receive {receive:.3g} GB/s")
    return ", ".join(parts)


if __name__ == "__main__":
    try:
        print(main(sys.argv[1]))
    except (OSError, ValueError, KeyError) as error:
        print(f"no numbers ({error})")
