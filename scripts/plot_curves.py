#!/usr/bin/env python3
"""Learning curves of moerl runs: training reward per learner step.

    scripts/plot_curves.py --out DIR LABEL=RUN_DIR[,RUN_DIR...] [LABEL=...]

Each LABEL (an objective, say) names one or more run directories (one per
seed); every run's metrics.jsonl gives learner.reward_mean per step. Writes
DIR/curve_<LABEL>.png (each run's curve and their mean, smoothed) and
DIR/curves.png (one line per LABEL: the mean over its runs, smoothed), and
prints the paths it wrote.

Exit status: 0 written; 2 bad arguments or unreadable metrics (the file is
named); 3 matplotlib is missing (Debian: apt-get install python3-matplotlib;
scripts/setup.sh installs it). moerl bench algos calls this script.
"""

import argparse
import json
import math
import os
import sys

MISSING_MATPLOTLIB = 3


def read_rewards(run_dir):
    """[(step, reward)] from RUN_DIR/metrics.jsonl, one per step (the last line of a step wins)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    by_step = {}
    try:
        with open(path) as f:
            for number, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    line = json.loads(text)
                except ValueError as error:
                    print("plot_curves: %s line %d is not JSON: %s" % (path, number, error), file=sys.stderr)
                    sys.exit(2)
                gauges = line.get("roles", {}).get("learner", {}).get("gauges", {})
                if "learner.reward_mean" in gauges and "step" in line:
                    by_step[int(line["step"])] = float(gauges["learner.reward_mean"])
    except OSError as error:
        print("plot_curves: cannot read %s: %s" % (path, error.strerror), file=sys.stderr)
        sys.exit(2)
    if not by_step:
        print("plot_curves: %s has no learner.reward_mean" % path, file=sys.stderr)
        sys.exit(2)
    return sorted(by_step.items())


def smooth(values, window):
    """Trailing moving average: step k averages the last `window` steps up to k."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def mean_curve(curves):
    """Mean over runs at each step that every run reached."""
    length = min(len(c) for c in curves)
    steps = [curves[0][i][0] for i in range(length)]
    return steps, [sum(c[i][1] for c in curves) / len(curves) for i in range(length)]


def parse_series(items):
    series = []
    for item in items:
        label, sep, dirs = item.partition("=")
        if not sep or not label or not dirs:
            print("plot_curves: expected LABEL=RUN_DIR[,RUN_DIR...], got '%s'" % item, file=sys.stderr)
            sys.exit(2)
        if not all(c.isalnum() or c in "-_." for c in label):
            print("plot_curves: label '%s' must be [A-Za-z0-9_.-] (it names a file)" % label, file=sys.stderr)
            sys.exit(2)
        series.append((label, [d for d in dirs.split(",") if d]))
    return series


def main():
    parser = argparse.ArgumentParser(description="Training-reward learning curves of moerl runs.")
    parser.add_argument("--out", required=True, help="directory for the PNG files")
    parser.add_argument("--title", default="training reward per step")
    parser.add_argument("series", nargs="+", help="LABEL=RUN_DIR[,RUN_DIR...]")
    args = parser.parse_args()
    series = parse_series(args.series)
    curves = {label: [read_rewards(d) for d in dirs] for label, dirs in series}
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display on a build machine
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_curves: matplotlib is not installed (Debian: apt-get install python3-matplotlib; "
              "scripts/setup.sh installs it)", file=sys.stderr)
        sys.exit(MISSING_MATPLOTLIB)
    os.makedirs(args.out, exist_ok=True)
    # A tenth of the run, at least 1: 200 steps of a noisy reward (about 32
    # episodes each) read best averaged over about 20.
    longest = max(len(c) for runs in curves.values() for c in runs)
    window = max(1, int(math.ceil(longest / 10)))
    written = []
    for label, _ in series:
        runs = curves[label]
        fig, ax = plt.subplots(figsize=(7, 4))
        for dirs, run in zip(dict(series)[label], runs):
            ax.plot([s for s, _ in run], [r for _, r in run], alpha=0.3, linewidth=0.8,
                    label=os.path.basename(os.path.normpath(dirs)))
        steps, mean = mean_curve(runs)
        ax.plot(steps, smooth(mean, window), linewidth=2, color="black",
                label="mean of %d run(s), %d-step average" % (len(runs), window))
        ax.set_xlabel("learner step")
        ax.set_ylabel("training reward (mean per step)")
        ax.set_title("%s: %s" % (label, args.title))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        path = os.path.join(args.out, "curve_%s.png" % label)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, _ in series:
        steps, mean = mean_curve(curves[label])
        ax.plot(steps, smooth(mean, window), linewidth=1.8, label=label)
    ax.set_xlabel("learner step")
    ax.set_ylabel("training reward, %d-step average" % window)
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    path = os.path.join(args.out, "curves.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
