"""Joins the rounds of scripts/bench_peer.sh into one table: measure | moerl | peer | ratio.

Each round left one JSON file per side and measure kind in the work directory:
moerl-decode-r<R>-t<T>.json (`moerl bench rollout --out`), peer-decode-r<R>-t<T>.json
(peer_decode.py), moerl-moe-r<R>.json (`moerl bench moe --out`), peer-moe-r<R>.json
(peer_moe.py), moerl-update-r<R>-t<T>.json (`moerl bench update --out`) and
peer-update-r<R>-t<T>.json (grpo_update.py). Every measure is in tokens/s (higher is better); the ratio is
moerl's median over the peer's median. A measure that one side lacks is listed
with that side empty and no ratio, never dropped.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics


def load(path):
    with open(path) as f:
        return json.load(f)


def decode_rows(work):
    rows = {}
    for path in glob.glob(os.path.join(work, "*-decode-r*-t*.json")):
        side = os.path.basename(path).split("-")[0]
        data = load(path)
        for c in data["cases"]:
            if side == "moerl":
                if c["name"] != "decode":
                    continue
                p, value = c["params"], c["metrics"]["tokens_per_s"]
                threads = int(re.search(r"-t(\d+)\.json$", path).group(1))
                key = (p["sessions"], p["context"], threads)
            else:
                key, value = (c["sessions"], c["context"], c["threads"]), c["tokens_per_s"]
            rows.setdefault(key, {"moerl": [], "peer": []})[side].append(value)
    return {f"decode tokens/s, batch {b}, context {ctx}, {t} thread(s)": v for (b, ctx, t), v in sorted(rows.items())}


def moe_rows(work):
    rows = {}
    for path in glob.glob(os.path.join(work, "*-moe-r*.json")):
        side = os.path.basename(path).split("-")[0]
        for c in load(path)["cases"]:
            if side == "moerl":
                if c["name"] != "layer_fwd_bwd" or c["params"].get("shared", 0) != 0:
                    continue
                p, value = c["params"], c["metrics"]["tokens_per_s"]
            else:
                p, value = c, c["tokens_per_s"]
            key = (p["experts"], p["top_k"], p["hidden"], p["d_expert"], p["tokens"], p["threads"])
            rows.setdefault(key, {"moerl": [], "peer": []})[side].append(value)
    return {f"MoE layer fwd+bwd tokens/s, E={e} k={k} hidden={h} d_expert={d} tokens={n}, {t} thread(s)": v
            for (e, k, h, d, n, t), v in sorted(rows.items())}


def update_rows(work):
    # One learner update, as tokens/s of the batch (higher is better, like the other rows).
    rows = {}
    for path in glob.glob(os.path.join(work, "*-update-r*-t*.json")):
        side = os.path.basename(path).split("-")[0]
        for c in load(path)["cases"]:
            if side == "moerl":
                if c["name"] != "grpo_update":
                    continue
                p, value = c["params"], c["metrics"]["tokens_per_s"]
            else:
                p, value = c, c["tokens_per_s"]
            key = (p["episodes"], p["tokens"], p["threads"])
            rows.setdefault(key, {"moerl": [], "peer": []})[side].append(value)
    return {f"GRPO update tokens/s, {e} episodes, {n} tokens, {t} thread(s)": v for (e, n, t), v in sorted(rows.items())}


def summary(values):
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "rounds": len(values)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", help="the directory holding the rounds' JSON files")
    parser.add_argument("--out", required=True, help="where to write the table as JSON")
    args = parser.parse_args()

    table = []
    for measure, sides in {**update_rows(args.work), **decode_rows(args.work), **moe_rows(args.work)}.items():
        moerl, peer = summary(sides["moerl"]), summary(sides["peer"])
        ratio = moerl["median"] / peer["median"] if moerl and peer and peer["median"] > 0 else None
        table.append({"measure": measure, "moerl": moerl, "peer": peer, "ratio": ratio})
    if not table:
        raise SystemExit("bench_peer: no results found in " + args.work)

    def cell(s):
        return "-" if s is None else f"{s['median']:.0f} (min {s['min']:.0f})"

    width = max(len(r["measure"]) for r in table)
    print(f"{'measure':<{width}} | {'moerl median (min)':>22} | {'peer median (min)':>22} | ratio")
    print("-" * (width + 60))
    for r in table:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(f"{r['measure']:<{width}} | {cell(r['moerl']):>22} | {cell(r['peer']):>22} | {ratio}")
    with open(args.out, "w") as f:
        json.dump({"rows": table}, f, indent=1)
    bad = [r["measure"] for r in table if r["ratio"] is not None and not (math.isfinite(r["ratio"]) and r["ratio"] > 0)]
    if bad:
        raise SystemExit("bench_peer: ratios that are not positive and finite: " + ", ".join(bad))


if __name__ == "__main__":
    main()
