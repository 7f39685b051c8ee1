#!/usr/bin/env python3
"""An HTML report of a moerl run, with PNG plots; also while the job runs.

    scripts/report.py RUN_DIR [--out DIR]

Reads RUN_DIR/metrics.jsonl (one line per learner step; the last line may be
half-written while the job runs: it is left out), RUN_DIR/summary.json (written
at the end of the run) and lists RUN_DIR/logs/. Writes DIR/index.html (default
RUN_DIR/report) and the PNGs it references by relative name:

    learning_<family>.png  training success and reward per step, held-out
                           evaluations with their 95% intervals
    throughput.png         tokens/s from the token counters over wall time
    staleness.png          policy staleness of the trained groups, dropped groups
    sync.png               weight publication time, learner update time, actor receive rate
    env_latency.png        environment step latency p50/p99 per family
    expert_load.png        expert load per layer and expert over steps (learner rank 0)
    events.png             learner step over wall time, failures and restarts marked
    memory.png             resident memory and KV cache per role

A plot without data is replaced by a line in the page that says so. Every
file is written to a temporary name and renamed, so a browser never reads
half a file. The last line printed is the path of index.html.

Exit status: 0 written; 2 RUN_DIR is not a run directory (no metrics.jsonl)
or the output cannot be written; 3 matplotlib is missing (Debian: apt-get
install python3-matplotlib; scripts/setup.sh installs it). `moerl report`
runs this script with Debian's /usr/bin/python3.
"""

import argparse
import datetime
import html
import json
import math
import os
import re
import socket
import sys

NOT_A_RUN = 2
MISSING_MATPLOTLIB = 3
PLOT_FILES = ["throughput.png", "staleness.png", "sync.png", "env_latency.png", "expert_load.png",
              "events.png", "memory.png"]  # plus learning_<family>.png
NAN = float("nan")


def die(status, message):
    print("report: " + message, file=sys.stderr)
    sys.exit(status)


# ---------------------------------------------------------------- reading

def dig(obj, *keys):
    """obj[k1][k2]...; None where a level is missing or not a dict."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def as_dict(value):
    return value if isinstance(value, dict) else {}


def ranks_of(line):
    ranks = line.get("ranks")
    return [r for r in ranks if isinstance(r, dict)] if isinstance(ranks, list) else []


def number(value):
    """A float, NaN for null / missing / not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return NAN
    return float(value)


def finite(value):
    return isinstance(value, float) and math.isfinite(value)


def read_metrics(path):
    """(lines, notes): the parsed metrics lines in file order, and what was left out."""
    with open(path, "rb") as f:
        data = f.read()  # one snapshot: the job may append while we read
    notes = []
    chunks = data.split(b"\n")
    partial = chunks.pop()  # after the last newline: empty, or a line still being written
    lines = []
    for number_, chunk in enumerate(chunks, 1):
        if not chunk.strip():
            continue
        try:
            line = json.loads(chunk.decode("utf-8", "replace"))
        except ValueError:
            notes.append("metrics.jsonl line %d is not JSON; left out" % number_)
            continue
        if isinstance(line, dict):
            lines.append(line)
    if partial.strip():
        try:
            line = json.loads(partial.decode("utf-8", "replace"))
            if isinstance(line, dict):
                lines.append(line)
        except ValueError:
            notes.append("the last line of metrics.jsonl is still being written (%d bytes so far); left out"
                         % len(partial))
    return lines, notes


def read_summary(path):
    """summary.json as a dict, None when absent; a note when it cannot be read."""
    if not os.path.exists(path):
        return None, None
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as error:
        return None, "summary.json could not be read (%s); treated as absent" % error
    return (summary if isinstance(summary, dict) else None), None


class Run:
    """What the report needs from metrics.jsonl, as per-line series."""

    def __init__(self, lines):
        self.lines = [l for l in lines if isinstance(l.get("step"), (int, float))]
        self.steps = [int(l["step"]) for l in self.lines]
        times = []
        for l in self.lines:
            t = number(l.get("time_ms"))
            times.append(t / 1000.0 if finite(t) else number(l.get("time")))
        t0 = next((t for t in times if finite(t)), 0.0)
        self.start_time = t0
        self.elapsed = [t - t0 if finite(t) else NAN for t in times]
        self.learner0 = [self._learner_zero(l) for l in self.lines]

    @staticmethod
    def _learner_zero(line):
        ranks = ranks_of(line)
        learners = [r for r in ranks if r.get("role") == "learner"]
        for r in learners:
            if r.get("rank") == 0:
                return r
        ranked = [r for r in learners if finite(number(r.get("rank")))]
        return min(ranked, key=lambda r: number(r.get("rank"))) if ranked else {}

    def __len__(self):
        return len(self.lines)

    def learner(self, group, name):
        """A learner-rank-0 metric per line (the learner role's aggregate where rank 0 lacks it)."""
        out = []
        for line, r0 in zip(self.lines, self.learner0):
            value = dig(r0, group, name)
            if value is None:
                value = dig(line, "roles", "learner", group, name)
            out.append(value)
        return out

    def role(self, role, group, name):
        return [dig(l, "roles", role, group, name) for l in self.lines]

    def learner_keys(self, group):
        keys = set()
        for line, r0 in zip(self.lines, self.learner0):
            keys.update(as_dict(dig(r0, group)))
            keys.update(as_dict(dig(line, "roles", "learner", group)))
        return keys

    def role_keys(self, role, group):
        keys = set()
        for line in self.lines:
            keys.update(as_dict(dig(line, "roles", role, group)))
        return keys

    def per_rank(self, group, name):
        """{(role, rank): [(elapsed, value)]} for every rank that reports the metric."""
        out = {}
        for line, t in zip(self.lines, self.elapsed):
            for r in ranks_of(line):
                value, rank = number(dig(r, group, name)), number(r.get("rank"))
                if finite(value) and finite(rank):
                    out.setdefault((str(r.get("role")), int(rank)), []).append((t, value))
        return out

    def time_of_step(self, step):
        for s, t in zip(self.steps, self.elapsed):
            if s >= step:
                return t
        return self.elapsed[-1] if self.elapsed else NAN


def families_of(run, summary):
    found = set()
    for key in run.learner_keys("gauges"):
        m = re.match(r"^(?:train|eval)\.([^.]+)\.", key)
        if m:
            found.add(m.group(1))
    for key in run.role_keys("env_worker", "histograms"):
        m = re.match(r"^env\.step_latency_s\.([^.]+)$", key)
        if m:
            found.add(m.group(1))
    for phase in ("before", "after"):
        found.update(as_dict(dig(summary, phase)))
    return sorted(f for f in found if re.match(r"^[A-Za-z0-9_-]+$", f))


def evaluations(run, family, mode):
    """[(step, success, ci_low, ci_high)]: every distinct value of the eval gauges.

    A value first seen in the metrics line of step s is placed at s - 1, the
    last step completed before the evaluation (the first, the base's, at 0).
    """
    prefix = "eval.%s.%s.success" % (family, mode)
    values = zip(run.steps, run.learner("gauges", prefix), run.learner("gauges", prefix + "_ci_low"),
                 run.learner("gauges", prefix + "_ci_high"))
    points, last = [], None
    for step, s, lo, hi in values:
        current = (number(s), number(lo), number(hi))
        if not finite(current[0]) or current == last:
            continue
        last = current
        points.append((max(step - 1, 0),) + current)
    return points


def events(run, summary):
    """(failures, restarts): [(step, label)] each, from summary.json or, mid-run, the metrics."""
    failures, restarts = [], []
    if summary and isinstance(summary.get("failures"), list):
        for f in summary["failures"]:
            if isinstance(f, dict) and finite(number(f.get("step"))):
                failures.append((int(f["step"]), "%s rank %s" % (f.get("role", "?"), f.get("rank", "?"))))
    if not failures:
        previous = 0.0
        for step, lost in zip(run.steps, run.learner("counters", "coordinator.lost_ranks")):
            lost = number(lost)
            if finite(lost) and lost > previous:
                failures.append((step, "%d rank(s) lost" % (lost - previous)))
            if finite(lost):
                previous = lost
    previous = None
    for step, count in zip(run.steps, run.learner("gauges", "job.restarts")):
        count = number(count)
        if finite(count) and previous is not None and count > previous:
            restarts.append((step, "restart %d" % count))
        if finite(count):
            previous = count
    return failures, restarts


def smooth(values, window):
    """Trailing mean over the last `window` finite values (NaN stays NaN)."""
    out, recent = [], []
    for v in values:
        if finite(v):
            recent.append(v)
            recent = recent[-window:]
            out.append(sum(recent) / len(recent))
        else:
            out.append(NAN)
    return out


def window_for(n):
    return max(1, min(25, int(math.ceil(n / 20.0))))


def interval_means(histograms):
    """Mean of the samples added since the previous line, from the cumulative count and mean."""
    out, previous = [], None
    for h in histograms:
        count, mean = number(dig(h, "count")), number(dig(h, "mean"))
        value = NAN
        if finite(count) and finite(mean):
            if previous and count > previous[0]:
                value = (count * mean - previous[0] * previous[1]) / (count - previous[0])
            elif previous is None and count > 0:
                value = mean
            previous = (count, mean)
        out.append(value)
    return out


def rates(times, counters, window):
    """Per line: counter increase per second over the last `window` lines (NaN across a reset)."""
    out = []
    values = [number(c) for c in counters]
    for i in range(len(values)):
        j = max(0, i - window)
        dt, dc = times[i] - times[j], values[i] - values[j]
        ok = i > 0 and finite(dt) and finite(dc) and dt > 0 and dc >= 0
        ok = ok and all(values[k] <= values[k + 1] for k in range(j, i) if finite(values[k]) and finite(values[k + 1]))
        out.append(dc / dt if ok else NAN)
    return out


def mean_rate(times, counters):
    """Counter increase per second over the run, leaving out intervals across a reset."""
    total_c = total_t = 0.0
    values = [number(c) for c in counters]
    for i in range(1, len(values)):
        dc, dt = values[i] - values[i - 1], times[i] - times[i - 1]
        if finite(dc) and finite(dt) and dc >= 0 and dt >= 0:
            total_c += dc
            total_t += dt
    return total_c / total_t if total_t > 0 else NAN


# ---------------------------------------------------------------- plots

class Plot:
    def __init__(self, file, title, caption):
        self.file, self.title, self.caption = file, title, caption
        self.missing = None  # why there is no plot


class Plotter:
    def __init__(self, plt, out_dir, run, summary, failures, restarts):
        self.plt, self.out, self.run, self.summary = plt, out_dir, run, summary
        self.failures, self.restarts = failures, restarts

    def save(self, fig, plot):
        path = os.path.join(self.out, plot.file)
        temporary = path + ".tmp"
        fig.tight_layout()
        fig.savefig(temporary, dpi=100, format="png")
        self.plt.close(fig)
        os.replace(temporary, path)

    def mark_steps(self, ax):
        for i, (step, label) in enumerate(self.failures):
            ax.axvline(step, color="red", linestyle=":", linewidth=1.2, label="failure" if i == 0 else None)
        for i, (step, label) in enumerate(self.restarts):
            ax.axvline(step, color="darkorange", linestyle="--", linewidth=1.2, label="restart" if i == 0 else None)

    def mark_times(self, ax):
        for i, (step, label) in enumerate(self.failures):
            ax.axvline(self.run.time_of_step(step), color="red", linestyle=":", linewidth=1.2,
                       label="failure" if i == 0 else None)
        for i, (step, label) in enumerate(self.restarts):
            ax.axvline(self.run.time_of_step(step), color="darkorange", linestyle="--", linewidth=1.2,
                       label="restart" if i == 0 else None)

    @staticmethod
    def finish_axes(ax, xlabel=None, ylabel=None):
        if xlabel:
            ax.set_xlabel(xlabel)
        if xlabel == "learner step":
            from matplotlib.ticker import MaxNLocator
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ylabel:
            ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, loc="best")

    def learning(self, family):
        run = self.run
        plot = Plot("learning_%s.png" % family, "Learning curve: %s" % family,
                    "Training success and reward of the episodes of each step (thin) and their trailing "
                    "mean (thick); the gauge keeps the last step that had episodes of the family. Points: "
                    "held-out evaluations (sampled, and greedy in hollow markers) with their 95% intervals.")
        success = [number(v) for v in run.learner("gauges", "train.%s.success" % family)]
        reward = [number(v) for v in run.learner("gauges", "train.%s.reward" % family)]
        evals = {mode: evaluations(run, family, mode) for mode in ("sampled", "greedy")}
        final = self.summary_evaluations(family)
        for mode, point in final.items():
            if point and not (evals[mode] and evals[mode][-1][1:] == point[1:] and evals[mode][-1][0] >= point[0] - 1):
                evals[mode].append(point)
            elif point and evals[mode]:
                evals[mode][-1] = point
        if not any(map(finite, success + reward)) and not any(evals.values()):
            plot.missing = "no training or evaluation metrics of family %s yet" % family
            return plot
        window = window_for(len(run))
        fig, (top, bottom) = self.plt.subplots(2, 1, figsize=(10, 5.5), sharex=True,
                                               gridspec_kw={"height_ratios": [3, 2]})
        if any(map(finite, success)):
            top.plot(run.steps, [100 * v for v in success], color="tab:blue", alpha=0.3, linewidth=0.8)
            top.plot(run.steps, [100 * v for v in smooth(success, window)], color="tab:blue", linewidth=2,
                     label="training success, %d-step mean" % window)
        for mode, style in (("sampled", dict(fmt="o", color="black")),
                            ("greedy", dict(fmt="s", color="tab:green", markerfacecolor="none"))):
            points = evals[mode]
            if not points:
                continue
            # Greedy points a little to the right, so that both intervals show.
            shift = 0.006 * max(max(run.steps or [1]), 10) if mode == "greedy" else 0
            xs = [p[0] + shift for p in points]
            ys = [100 * p[1] for p in points]
            low = [max(0.0, 100 * (p[1] - p[2])) if finite(p[2]) else 0 for p in points]
            high = [max(0.0, 100 * (p[3] - p[1])) if finite(p[3]) else 0 for p in points]
            top.errorbar(xs, ys, yerr=[low, high], capsize=4, markersize=6, linewidth=1.2,
                         label="held-out %s (95%% interval)" % mode, **style)
        top.set_ylim(-3, 103)
        top.set_title("%s: success per step and held-out evaluations" % family)
        self.mark_steps(top)
        self.finish_axes(top, ylabel="success (%)")
        if any(map(finite, reward)):
            bottom.plot(run.steps, reward, color="tab:purple", alpha=0.3, linewidth=0.8)
            bottom.plot(run.steps, smooth(reward, window), color="tab:purple", linewidth=2,
                        label="training reward, %d-step mean" % window)
        else:
            bottom.text(0.5, 0.5, "no training reward yet", ha="center", va="center", transform=bottom.transAxes)
        self.mark_steps(bottom)
        self.finish_axes(bottom, "learner step", "reward")
        self.save(fig, plot)
        return plot

    def summary_evaluations(self, family):
        """The final evaluation of summary.json, at the last step: {mode: (step, success, low, high)}."""
        out = {}
        if not self.summary:
            return out
        steps = number(self.summary.get("steps"))
        for mode, key in (("sampled", "after"), ("greedy", "after_greedy")):
            score = dig(self.summary, key, family)
            if isinstance(score, dict) and finite(number(score.get("success"))) and finite(steps):
                out[mode] = (int(steps), number(score.get("success")), number(score.get("ci_low")),
                             number(score.get("ci_high")))
        return out

    def throughput(self):
        run = self.run
        plot = Plot("throughput.png", "Throughput",
                    "Tokens per second from the increase of the token counters between metrics lines "
                    "(over a few lines, so that short steps do not read as spikes): tokens generated for "
                    "trained episodes and trained on (learner), tokens decoded by all actors.")
        window = window_for(len(run))
        series = [("generated (learner.generated_tokens)", run.learner("counters", "learner.generated_tokens")),
                  ("trained (learner.trained_tokens)", run.learner("counters", "learner.trained_tokens")),
                  ("decoded by the actors (rollout.decode_tokens)", run.role("actor", "counters", "rollout.decode_tokens"))]
        curves = [(label, rates(run.elapsed, values, window), mean_rate(run.elapsed, values)) for label, values in series]
        curves = [c for c in curves if any(map(finite, c[1]))]
        if not curves:
            plot.missing = "no token counters over two metrics lines yet"
            return plot
        fig, ax = self.plt.subplots(figsize=(10, 4))
        for label, values, mean in curves:
            ax.plot(run.elapsed, values, linewidth=1.5, label="%s: mean %s tok/s" % (label, fmt_count(mean)))
        ax.set_ylim(bottom=0)
        ax.set_title("tokens/s over wall time")
        self.mark_times(ax)
        self.finish_axes(ax, "seconds since the first metrics line", "tokens/s")
        self.save(fig, plot)
        return plot

    def staleness(self):
        run = self.run
        plot = Plot("staleness.png", "Staleness",
                    "Policy versions between the policy that generated a group and the learner's when it "
                    "trained on it: the mean of each step, and the p90 and maximum over the run so far "
                    "(learner.staleness_versions); below, groups dropped as too stale per step.")
        mean = [number(v) for v in run.learner("gauges", "learner.staleness_mean")]
        hist = run.learner("histograms", "learner.staleness_versions")
        p90 = [number(dig(h, "p90")) for h in hist]
        high = [number(dig(h, "max")) for h in hist]
        dropped = [number(v) for v in run.learner("counters", "learner.dropped_groups")]
        if not any(map(finite, mean + p90 + high)):
            plot.missing = "no staleness metrics yet (learner.staleness_mean, learner.staleness_versions)"
            return plot
        fig, (top, bottom) = self.plt.subplots(2, 1, figsize=(10, 5), sharex=True,
                                               gridspec_kw={"height_ratios": [3, 1.3]})
        window = window_for(len(run))
        top.plot(run.steps, mean, color="tab:blue", alpha=0.3, linewidth=0.8)
        top.plot(run.steps, smooth(mean, window), color="tab:blue", linewidth=2, label="mean per step, %d-step mean" % window)
        top.plot(run.steps, p90, color="tab:orange", linewidth=1.2, label="p90 so far")
        top.plot(run.steps, high, color="tab:red", linewidth=1, linestyle="--", label="max so far")
        top.set_ylim(bottom=0)
        top.set_title("staleness of the trained groups (versions)")
        self.mark_steps(top)
        self.finish_axes(top, ylabel="versions")
        per_step, previous = [], None
        for v in dropped:
            per_step.append(v - previous if finite(v) and previous is not None and v >= previous else (NAN if not finite(v) else 0))
            if finite(v):
                previous = v
        if any(map(finite, dropped)):
            bottom.bar(run.steps, [v if finite(v) else 0 for v in per_step], color="tab:gray",
                       label="dropped groups per step (total %d)" % max(v for v in dropped if finite(v)))
        else:
            bottom.text(0.5, 0.5, "no learner.dropped_groups counter", ha="center", va="center", transform=bottom.transAxes)
        self.mark_steps(bottom)
        self.finish_axes(bottom, "learner step", "groups")
        self.save(fig, plot)
        return plot

    def sync(self):
        run = self.run
        plot = Plot("sync.png", "Weight sync",
                    "Publishing new weights to the actors (learner rank 0): a publication from its start until "
                    "the last actor has the weights (sync.publication_s; asynchronous, it overlaps the next "
                    "update): the mean of those since the previous line and the p50/p99 over the run so far; "
                    "the time the learner is blocked by it (sync.publish_s); the learner's update time per "
                    "step for scale. Below, the rate at which each actor received the weights "
                    "(sync.receive_GB_per_s).")
        publication = run.learner("histograms", "sync.publication_s")
        mean = interval_means(publication)
        p50 = [number(dig(h, "p50")) for h in publication]
        p99 = [number(dig(h, "p99")) for h in publication]
        blocked = interval_means(run.learner("histograms", "sync.publish_s"))
        update = interval_means(run.learner("histograms", "learner.update_s"))
        receive = run.per_rank("gauges", "sync.receive_GB_per_s")
        if not any(map(finite, mean + p50 + p99)):
            plot.missing = "no weight publication recorded yet (sync.publication_s)"
            return plot
        fig, (top, bottom) = self.plt.subplots(2, 1, figsize=(10, 5.5), gridspec_kw={"height_ratios": [3, 2]})
        ms = lambda values: [1e3 * v for v in values]
        top.plot(run.steps, ms(mean), color="tab:blue", linewidth=1.5, marker=".", label="publication, mean since the previous line")
        top.plot(run.steps, ms(p50), color="tab:green", linewidth=1, label="publication p50 so far")
        top.plot(run.steps, ms(p99), color="tab:red", linewidth=1, linestyle="--", label="publication p99 so far")
        if any(map(finite, blocked)):
            top.plot(run.steps, ms(blocked), color="tab:purple", linewidth=1, label="learner blocked by publishing (sync.publish_s)")
        if any(map(finite, update)):
            top.plot(run.steps, ms(update), color="tab:gray", linewidth=1, alpha=0.7, label="learner update per step")
        if any(v > 0 for v in mean + p99 + update + blocked if finite(v)):
            from matplotlib.ticker import FuncFormatter
            top.set_yscale("log")
            top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%g" % v))
        top.set_title("weight publication time (ms)")
        self.mark_steps(top)
        self.finish_axes(top, "learner step", "ms")
        if receive:
            for (role, rank), points in sorted(receive.items(), key=lambda kv: kv[0][1]):
                bottom.plot([p[0] for p in points], [p[1] for p in points], linewidth=1, label="%s rank %d" % (role, rank))
            bottom.set_ylim(bottom=0)
        else:
            bottom.text(0.5, 0.5, "no actor reported sync.receive_GB_per_s", ha="center", va="center", transform=bottom.transAxes)
        self.mark_times(bottom)
        self.finish_axes(bottom, "seconds since the first metrics line", "received GB/s")
        self.save(fig, plot)
        return plot

    def env_latency(self, families):
        run = self.run
        plot = Plot("env_latency.png", "Environment step latency",
                    "One environment step per family, over all env workers: p50 (solid) and p99 (dashed) "
                    "of the steps so far, at each learner step.")
        curves = []
        for family in families:
            hist = run.role("env_worker", "histograms", "env.step_latency_s.%s" % family)
            p50 = [number(dig(h, "p50")) for h in hist]
            p99 = [number(dig(h, "p99")) for h in hist]
            if any(map(finite, p50 + p99)):
                curves.append((family, p50, p99))
        if not curves:
            plot.missing = "no environment step latency recorded yet (env.step_latency_s.<family>)"
            return plot
        fig, ax = self.plt.subplots(figsize=(10, 4))
        colors = self.plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, (family, p50, p99) in enumerate(curves):
            color = colors[i % len(colors)]
            ax.plot(run.steps, [1e3 * v for v in p50], color=color, linewidth=1.8, label="%s p50" % family)
            ax.plot(run.steps, [1e3 * v for v in p99], color=color, linewidth=1.2, linestyle="--", label="%s p99" % family)
        if any(v > 0 for _, a, b in curves for v in a + b if finite(v)):
            from matplotlib.ticker import FuncFormatter
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%g" % v))
        ax.set_title("environment step latency (ms)")
        self.mark_steps(ax)
        self.finish_axes(ax, "learner step", "ms")
        self.save(fig, plot)
        return plot

    def expert_load(self):
        run = self.run
        plot = Plot("expert_load.png", "Expert load",
                    "The share of routed token assignments each expert received in each learner step "
                    "(learner rank 0, moe.layer.L.expert.E.load; 1/experts is even), one panel per layer; "
                    "imbalance is max/mean load.")
        layers = {}
        for key in run.learner_keys("gauges"):
            m = re.match(r"^moe\.layer\.(\d+)\.expert\.(\d+)\.load$", key)
            if m:
                layers.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        if not layers or not run.steps:
            plot.missing = "no expert load recorded by the learner yet (moe.layer.L.expert.E.load)"
            return plot
        import numpy as np
        order = sorted(layers)
        fig, axes = self.plt.subplots(len(order), 1, figsize=(10, 1.2 + 1.9 * len(order)), squeeze=False)
        steps = np.array(run.steps, dtype=float)
        if len(steps) > 1:
            middles = (steps[1:] + steps[:-1]) / 2
            edges = np.concatenate([[steps[0] - (middles[0] - steps[0])], middles, [steps[-1] + (steps[-1] - middles[-1])]])
        else:
            edges = np.array([steps[0] - 0.5, steps[0] + 0.5])
        for ax, layer in zip(axes[:, 0], order):
            experts = max(layers[layer]) + 1
            grid = np.full((experts, len(steps)), np.nan)
            for e in layers[layer]:
                grid[e, :] = [number(v) for v in run.learner("gauges", "moe.layer.%d.expert.%d.load" % (layer, e))]
            imbalance = [number(v) for v in run.learner("gauges", "moe.layer.%d.imbalance" % layer)]
            imbalance = [v for v in imbalance if finite(v)]
            mesh = ax.pcolormesh(edges, np.arange(experts + 1) - 0.5, np.ma.masked_invalid(grid), cmap="viridis",
                                 vmin=0, shading="flat")
            fig.colorbar(mesh, ax=ax, pad=0.01, label="load share")
            ax.set_ylabel("expert")
            ax.set_yticks(range(experts) if experts <= 16 else range(0, experts, max(1, experts // 8)))
            title = "layer %d (%d experts)" % (layer, experts)
            if imbalance:
                title += ": imbalance last %.2f, mean %.2f, max %.2f" % (imbalance[-1], sum(imbalance) / len(imbalance),
                                                                          max(imbalance))
            ax.set_title(title, fontsize=9)
        axes[-1, 0].set_xlabel("learner step")
        self.save(fig, plot)
        return plot

    def events(self):
        run = self.run
        plot = Plot("events.png", "Progress, failures and restarts",
                    "The learner step over wall time; failures (a rank lost: red, from summary.json or, "
                    "mid-run, coordinator.lost_ranks) and restarts of the job (orange, job.restarts) are "
                    "marked at the step they happened. The same marks appear on the other plots.")
        points = [(t, s) for t, s in zip(run.elapsed, run.steps) if finite(t)]
        if not points:
            plot.missing = "no metrics lines yet"
            return plot
        fig, ax = self.plt.subplots(figsize=(10, 3.5))
        ax.plot([p[0] for p in points], [p[1] for p in points], color="tab:blue", linewidth=1.8, label="learner step")
        for i, (step, label) in enumerate(self.failures):
            t = run.time_of_step(step)
            ax.plot([t], [step], "x", color="red", markersize=10, markeredgewidth=2, label="failure" if i == 0 else None)
            ax.annotate(label, (t, step), textcoords="offset points", xytext=(4, 6), fontsize=7, color="red")
        for i, (step, label) in enumerate(self.restarts):
            ax.axvline(run.time_of_step(step), color="darkorange", linestyle="--", label="restart" if i == 0 else None)
        title = "%d failure(s), %d restart(s)" % (len(self.failures), len(self.restarts))
        if self.summary and finite(number(self.summary.get("restarts"))):
            title += "; summary.json: %d restart(s)" % number(self.summary.get("restarts"))
        ax.set_title(title)
        self.finish_axes(ax, "seconds since the first metrics line", "learner step")
        self.save(fig, plot)
        return plot

    def memory(self):
        run = self.run
        plot = Plot("memory.png", "Memory per role",
                    "Resident memory of the ranks of each role (process.resident_bytes): the largest rank "
                    "(line) and the range over the role's ranks (band); below, the KV cache in use by the "
                    "actors (rollout.kv_bytes).")
        resident = run.per_rank("gauges", "process.resident_bytes")
        kv = run.per_rank("gauges", "rollout.kv_bytes")
        if not resident and not kv:
            plot.missing = "no rank reported process.resident_bytes or rollout.kv_bytes yet"
            return plot
        fig, (top, bottom) = self.plt.subplots(2, 1, figsize=(10, 5.5), sharex=True,
                                               gridspec_kw={"height_ratios": [3, 2]})
        for ax, data, scale, unit in ((top, resident, 2.0 ** 20, "MiB"), (bottom, kv, 2.0 ** 20, "MiB")):
            by_role = {}
            for (role, rank), points in data.items():
                for t, v in points:
                    by_role.setdefault(role, {}).setdefault(t, []).append(v / scale)
            for role in sorted(by_role):
                ranks = len({rank for (r, rank) in data if r == role})
                times = sorted(by_role[role])
                ax.plot(times, [max(by_role[role][t]) for t in times], linewidth=1.6,
                        label="%s (%d rank%s): max" % (role, ranks, "" if ranks == 1 else "s"))
                if ranks > 1:
                    ax.fill_between(times, [min(by_role[role][t]) for t in times],
                                    [max(by_role[role][t]) for t in times], alpha=0.2)
            if not by_role:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            else:
                ax.set_ylim(bottom=0)
            self.mark_times(ax)
        roles = {str(r.get("role")) for line in run.lines for r in ranks_of(line)}
        silent = sorted(roles - {role for role, _ in resident})
        top.set_title("resident memory per role (MiB)" + ("; not reported by: %s" % ", ".join(silent) if silent else ""))
        self.finish_axes(top, ylabel="resident MiB")
        self.finish_axes(bottom, "seconds since the first metrics line", "KV cache MiB")
        self.save(fig, plot)
        return plot


# ---------------------------------------------------------------- page

def fmt_count(value):
    if not finite(value):
        return "n/a"
    return "{:,.0f}".format(value)


def pct(value):
    return "%.1f%%" % (100 * value)


def points(value):
    return "%+.1f" % (100 * value)


def cell(key, value, text):
    """A number of the page with its exact value, for tests and scripts: data-key names it in summary.json."""
    return '<span class="v" data-key="%s" data-value="%r">%s</span>' % (html.escape(key), value, html.escape(text))


def score_cell(key, score):
    if not isinstance(score, dict) or not finite(number(score.get("success"))):
        return "<td>n/a</td>"
    parts = [cell(key + ".success", float(score["success"]), pct(float(score["success"])))]
    if finite(number(score.get("ci_low"))) and finite(number(score.get("ci_high"))):
        parts.append(' <span class="ci">[%s, %s]</span>' % (cell(key + ".ci_low", float(score["ci_low"]), pct(float(score["ci_low"]))),
                                    cell(key + ".ci_high", float(score["ci_high"]), pct(float(score["ci_high"])))))
    return "<td>%s</td>" % "".join(parts)


def gain_cell(key, gain):
    if not isinstance(gain, dict) or not finite(number(gain.get("value"))):
        return "<td>n/a</td>"
    text = cell(key + ".value", float(gain["value"]), points(float(gain["value"])))
    if finite(number(gain.get("ci_low"))) and finite(number(gain.get("ci_high"))):
        text += ' <span class="ci">[%s, %s]</span>' % (cell(key + ".ci_low", float(gain["ci_low"]), points(float(gain["ci_low"]))),
                               cell(key + ".ci_high", float(gain["ci_high"]), points(float(gain["ci_high"]))))
    return "<td>%s</td>" % text


def summary_table(summary, families):
    rows = []
    for family in families:
        episodes = number(dig(summary, "after", family, "episodes"))
        if not finite(episodes):
            episodes = number(dig(summary, "before", family, "episodes"))
        rows.append("<tr><th>%s</th><td>%s</td>%s%s%s%s%s%s</tr>" % (
            html.escape(family), "%d" % episodes if finite(episodes) else "n/a", score_cell("before.%s" % family, dig(summary, "before", family)),
            score_cell("after.%s" % family, dig(summary, "after", family)),
            gain_cell("gain.%s" % family, dig(summary, "gain", family)),
            score_cell("before_greedy.%s" % family, dig(summary, "before_greedy", family)),
            score_cell("after_greedy.%s" % family, dig(summary, "after_greedy", family)),
            gain_cell("gain_greedy.%s" % family, dig(summary, "gain_greedy", family))))
    return ('<table id="before-after"><tr><th>family</th><th>episodes</th><th>before (sampled)</th><th>after (sampled)</th>'
            '<th>gain, points</th><th>before (greedy)</th><th>after (greedy)</th><th>gain (greedy)</th></tr>\n%s\n'
            '</table>' % "\n".join(rows))


def latest_table(run, families):
    rows = []
    for family in families:
        cells = []
        for mode in ("sampled", "greedy"):
            evals = evaluations(run, family, mode)
            if evals:
                step, s, lo, hi = evals[-1]
                text = pct(s) + (" [%s, %s]" % (pct(lo), pct(hi)) if finite(lo) and finite(hi) else "")
                cells.append("<td>%s <span class=\"n\">(after step %d; %d evaluation%s)</span></td>"
                             % (text, step, len(evals), "" if len(evals) == 1 else "s"))
            else:
                cells.append("<td>n/a</td>")
        train = [number(v) for v in run.learner("gauges", "train.%s.success" % family)]
        recent = [v for v in train if finite(v)][-window_for(len(run)) * 2:]
        cells.append("<td>%s</td>" % (pct(sum(recent) / len(recent)) + " <span class=\"n\">(last %d steps)</span>"
                                      % len(recent) if recent else "n/a"))
        rows.append("<tr><th>%s</th>%s</tr>" % (html.escape(family), "".join(cells)))
    return ('<table id="latest"><tr><th>family</th><th>latest held-out (sampled)</th>'
            '<th>latest held-out (greedy)</th><th>training success</th></tr>\n%s\n</table>' % "\n".join(rows))


def failures_table(summary):
    failures = [f for f in (dig(summary, "failures") or []) if isinstance(f, dict)]
    if not failures:
        return ""
    keys = ["rank", "role", "kind", "step", "detected_after_s", "recovered_after_s", "steps_lost"]
    head = "".join("<th>%s</th>" % k for k in keys)
    rows = []
    for f in failures:
        values = []
        for k in keys:
            v = f.get(k, "")
            values.append("<td>%s</td>" % html.escape("%.2f" % v if isinstance(v, float) else str(v)))
        rows.append("<tr>%s</tr>" % "".join(values))
    return '<h3>Failures (summary.json)</h3>\n<table id="failures"><tr>%s</tr>\n%s\n</table>' % (head, "\n".join(rows))


def alive_ranks(run_dir):
    """How many of the run's rank records name a live moerl process on this host; None without records."""
    directory = os.path.join(run_dir, "ranks")
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
    except OSError:
        return None
    host, alive = socket.gethostname(), 0
    for name in names:
        try:
            with open(os.path.join(directory, name)) as f:
                record = json.load(f)
            if record.get("host") not in (host, None):
                continue
            with open("/proc/%d/cmdline" % int(record["pid"]), "rb") as f:
                alive += b"moerl" in f.read()
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return alive


def logs_section(run_dir, out_dir):
    directory = os.path.join(run_dir, "logs")
    try:
        names = sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))
    except OSError:
        return "<p>No logs directory (%s).</p>" % html.escape(directory)
    if not names:
        return "<p>%s is empty.</p>" % html.escape(directory)
    items, warnings = [], []
    for name in names:
        path = os.path.join(directory, name)
        link = os.path.relpath(path, out_dir)
        items.append('<li><a href="%s">%s</a> (%s bytes)</li>' % (html.escape(link), html.escape(name),
                                                                    fmt_count(os.path.getsize(path))))
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 200000))
                for text in f.read().decode("utf-8", "replace").splitlines():
                    if "[warning]" in text or "[error]" in text or "[critical]" in text:
                        warnings.append("%s: %s" % (name, text))
        except OSError:
            continue
    out = "<ul>%s</ul>" % "".join(items)
    if warnings:
        out += "<p>The last warnings and errors:</p><pre>%s</pre>" % html.escape("\n".join(warnings[-20:]))
    return out


STYLE = """
body { font-family: sans-serif; margin: 1.5em; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; }
.status { display: inline-block; padding: 0.2em 0.6em; border-radius: 4px; font-weight: bold; }
.finished { background: #d7f0d7; } .progress { background: #fde9c4; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; font-size: 0.9em; }
.v, .ci { white-space: nowrap; }
.n { color: #777; font-size: 0.85em; }
.nodata { color: #a33; font-style: italic; }
img { max-width: 100%; border: 1px solid #eee; }
.notes { color: #555; font-size: 0.9em; }
pre { background: #f6f6f6; padding: 0.5em; overflow-x: auto; font-size: 0.8em; }
"""


def page(run_dir, out_dir, run, summary, finished, families, plots, notes, failures, restarts):
    name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
    last_step = run.steps[-1] if run.steps else None
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>moerl report: %s</title><style>%s</style></head><body>" % (html.escape(name), STYLE),
             "<h1>moerl report: %s</h1>" % html.escape(name),
             "<p>%s</p>" % html.escape(os.path.abspath(run_dir))]
    generated = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    if finished:
        parts.append('<p><span class="status finished" id="status">run finished</span> after %s steps in %s s; '
                     "report written %s.</p>" % (html.escape(str(summary.get("steps", "?"))),
                                                 "%.0f" % number(summary.get("wall_s")), generated))
    else:
        alive = alive_ranks(run_dir)
        where = ""
        if alive == 0:
            where = " (no rank of it runs on this host now: it may have stopped before its end)"
        parts.append('<p><span class="status progress" id="status">run in progress</span> at step %s%s; '
                     "report written %s. Run <code>moerl report %s</code> again for a newer one.</p>"
                     % (last_step if last_step is not None else "none yet", html.escape(where), generated,
                        html.escape(run_dir)))
    # Headline numbers.
    facts = [("learner steps in metrics.jsonl", str(len(run))),
             ("wall time covered by the metrics", "%.0f s" % run.elapsed[-1] if run.elapsed and finite(run.elapsed[-1]) else "n/a")]
    for label, values in (("generated tokens/s (mean)", run.learner("counters", "learner.generated_tokens")),
                          ("trained tokens/s (mean)", run.learner("counters", "learner.trained_tokens")),
                          ("actor decode tokens/s (mean)", run.role("actor", "counters", "rollout.decode_tokens"))):
        facts.append((label, fmt_count(mean_rate(run.elapsed, values))))
    staleness = [number(v) for v in run.learner("gauges", "learner.staleness_mean")]
    staleness = [v for v in staleness if finite(v)]
    facts.append(("staleness, mean over steps", "%.2f versions" % (sum(staleness) / len(staleness)) if staleness else "n/a"))
    facts.append(("failures / restarts", "%d / %d" % (len(failures), number(summary.get("restarts"))
                                                     if summary and finite(number(summary.get("restarts"))) else len(restarts))))
    parts.append('<table id="facts">%s</table>' % "".join("<tr><th>%s</th><td>%s</td></tr>" % (html.escape(k), html.escape(v))
                                                         for k, v in facts))
    if notes:
        parts.append('<p class="notes">%s</p>' % "<br>".join(html.escape(n) for n in notes))
    # Before / after.
    parts.append("<h2>Held-out success: before and after</h2>")
    if finished:
        parts.append("<p>From summary.json: held-out success of the base (before) and the trained policy (after) "
                     "with 95% intervals; gains in points.</p>")
        parts.append(summary_table(summary, families))
    else:
        parts.append("<p><b>run in progress</b>: no final evaluation yet (summary.json is written at the end). "
                     "The latest held-out evaluation in the metrics:</p>")
        parts.append(latest_table(run, families))
        if summary:
            parts.append("<p>summary.json from an earlier end of this run, at step %s:</p>"
                         % html.escape(str(summary.get("steps", "?"))))
            parts.append(summary_table(summary, families))
    parts.append(failures_table(summary))
    # Plots.
    for plot in plots:
        parts.append("<h2>%s</h2>" % html.escape(plot.title))
        if plot.missing:
            parts.append('<p class="nodata">No plot: %s.</p>' % html.escape(plot.missing))
        else:
            parts.append('<p>%s</p>\n<img src="%s" alt="%s">' % (html.escape(plot.caption), html.escape(plot.file),
                                                                 html.escape(plot.title)))
    parts.append("<h2>Logs</h2>")
    parts.append(logs_section(run_dir, out_dir))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def main():
    parser = argparse.ArgumentParser(description="An HTML report with plots of a moerl run (also mid-run).")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds metrics.jsonl)")
    parser.add_argument("--out", help="output directory (default RUN_DIR/report)")
    args = parser.parse_args()
    run_dir = args.run_dir
    if not os.path.isdir(run_dir):
        die(NOT_A_RUN, "%s: no such directory" % run_dir)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics_path):
        die(NOT_A_RUN, "%s is not a run directory: it has no metrics.jsonl" % run_dir)
    # summary.json first: if the job ends while we read, the metrics are
    # complete anyway and the page says "in progress" for this one report.
    summary, summary_note = read_summary(os.path.join(run_dir, "summary.json"))
    try:
        lines, notes = read_metrics(metrics_path)
    except OSError as error:
        die(NOT_A_RUN, "cannot read %s: %s" % (metrics_path, error.strerror))
    if summary_note:
        notes.append(summary_note)
    run = Run(lines)
    # A summary of an earlier end (the run was resumed for more steps since) does not end this one.
    finished = bool(summary) and (not run.steps or number(summary.get("steps")) >= run.steps[-1])
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display
        import matplotlib.pyplot as plt
    except ImportError:
        die(MISSING_MATPLOTLIB, "matplotlib is not installed for %s (Debian: apt-get install python3-matplotlib; "
            "scripts/setup.sh installs it)" % sys.executable)
    out_dir = args.out or os.path.join(run_dir, "report")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        die(NOT_A_RUN, "cannot create %s: %s" % (out_dir, error.strerror))
    families = families_of(run, summary)
    failures, restarts = events(run, summary)
    plotter = Plotter(plt, out_dir, run, summary, failures, restarts)
    jobs = [("learning_%s.png" % f, "Learning curve: %s" % f, lambda f=f: plotter.learning(f)) for f in families]
    jobs += [("throughput.png", "Throughput", plotter.throughput), ("staleness.png", "Staleness", plotter.staleness),
             ("sync.png", "Weight sync", plotter.sync),
             ("env_latency.png", "Environment step latency", lambda: plotter.env_latency(families)),
             ("expert_load.png", "Expert load", plotter.expert_load),
             ("events.png", "Progress, failures and restarts", plotter.events),
             ("memory.png", "Memory per role", plotter.memory)]
    plots = []
    for file, title, job in jobs:
        try:
            plots.append(job())
        except OSError as error:
            die(NOT_A_RUN, "cannot write into %s: %s" % (out_dir, error))
        except Exception as error:  # metrics this script did not foresee: one plot lost, not the page
            plt.close("all")
            broken = Plot(file, title, "")
            broken.missing = "it could not be drawn from these metrics (%s: %s)" % (type(error).__name__, error)
            print("report: %s: %s" % (file, broken.missing), file=sys.stderr)
            plots.append(broken)
    if not families:
        missing = Plot("learning.png", "Learning curves", "")
        missing.missing = "no task family in the metrics or summary.json yet"
        plots.insert(0, missing)
    # A plot without data this time must not show an old picture.
    for plot in plots:
        if plot.missing and os.path.exists(os.path.join(out_dir, plot.file)):
            os.remove(os.path.join(out_dir, plot.file))
    index = os.path.join(out_dir, "index.html")
    try:
        with open(index + ".tmp", "w") as f:
            f.write(page(run_dir, out_dir, run, summary, finished, families, plots, notes, failures, restarts))
        os.replace(index + ".tmp", index)
    except OSError as error:
        die(NOT_A_RUN, "cannot write %s: %s" % (index, error))
    drawn = [p for p in plots if not p.missing]
    print("report: %s at step %s; %d plot(s)%s" % (
        "run finished" if finished else "run in progress", run.steps[-1] if run.steps else "none",
        len(drawn), "" if len(drawn) == len(plots) else ", %d without data (%s)" % (
            len(plots) - len(drawn), ", ".join(p.file for p in plots if p.missing))))
    for note in notes:
        print("report: note: " + note)
    print(os.path.abspath(index))


if __name__ == "__main__":
    main()
