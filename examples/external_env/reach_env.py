#!/usr/bin/env python3
"""An external moerl environment in plain Python (standard library only).

Task "reach": start at a number and reach the target with as few moves as
possible, using `add K` (1 <= K <= 9) and `double`. It speaks the JSON-lines
protocol of docs/external_env.md on stdin/stdout, one session per process.

Options for fault-injection tests (each fault fires once per marker file, so
the restarted process behaves):
  --crash-at-turn N   exit(3) when asked for turn N
  --hang-at-turn N    stop answering at turn N
  --garbage-at-turn N answer turn N with a line that is not JSON
  --marker PATH       file recording that a fault already fired
"""
import argparse
import json
import os
import random
import sys
import time


class ReachSession:
    def __init__(self, difficulty, seed, shaping, max_turns):
        rng = random.Random(seed)
        self.value = rng.randint(1, 5)
        self.target = self.value + rng.randint(5 * difficulty, 20 * difficulty)
        self.shaping = shaping
        self.turns = 0
        self.max_turns = max_turns or 4 + 4 * difficulty
        self.done = False
        self.success = False

    def observation(self):
        return f"value {self.value} target {self.target} turns left {self.max_turns - self.turns}"

    def first_observation(self):
        return ("Reach the target. Actions: add K (1-9) or double. " + self.observation())

    def distance(self):
        return abs(self.target - self.value)

    def step(self, action):
        before = self.distance()
        words = action.strip().split()
        invalid = None
        if words == ["double"]:
            self.value *= 2
        elif len(words) == 2 and words[0] == "add" and words[1].isdigit() and 1 <= int(words[1]) <= 9:
            self.value += int(words[1])
        else:
            invalid = "expected 'add K' with K in 1-9, or 'double'"
        self.turns += 1
        self.success = self.value == self.target
        self.done = self.success or self.turns >= self.max_turns or self.value > 4 * self.target
        reward = 1.0 if self.success else 0.0
        if self.shaping == "shaped" and not self.success:
            reward += 0.05 * (before - self.distance()) / max(1, self.target)
        text = ("invalid action: " + invalid + ". " if invalid else "") + self.observation()
        info = {"invalid": "1" if invalid else "0"}
        return text, reward, self.done, info

    def expert(self, error_rate, seed):
        rng = random.Random(seed)
        if rng.random() < error_rate:
            return rng.choice(["double", "add 9", "add 1"])
        if self.value * 2 <= self.target and self.target - self.value * 2 < self.target - self.value - 9:
            return "double"
        return "add %d" % max(1, min(9, self.target - self.value))

    def state(self):
        return json.dumps([self.value, self.target, self.shaping, self.turns, self.max_turns,
                           self.done, self.success])

    def restore(self, state):
        (self.value, self.target, self.shaping, self.turns, self.max_turns,
         self.done, self.success) = json.loads(state)


def fault_due(args, turn, kind):
    wanted = getattr(args, kind)
    if wanted is None or turn != wanted:
        return False
    if args.marker and os.path.exists(args.marker):
        return False
    if args.marker:
        with open(args.marker, "w") as marker:
            marker.write(kind)
    return True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-at-turn", dest="crash", type=int)
    parser.add_argument("--hang-at-turn", dest="hang", type=int)
    parser.add_argument("--garbage-at-turn", dest="garbage", type=int)
    parser.add_argument("--marker")
    args = parser.parse_args()

    session = None
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        reply = {"id": request.get("id"), "ok": True}
        try:
            if op == "open":
                session = ReachSession(request["difficulty"], request["seed"],
                                       request.get("shaping", "sparse"), request.get("max_turns", 0))
                reply["observation"] = session.first_observation()
                reply["max_turns"] = session.max_turns
            elif op == "step":
                turn = session.turns + 1
                if fault_due(args, turn, "crash"):
                    sys.exit(3)
                if fault_due(args, turn, "hang"):
                    time.sleep(3600)
                if fault_due(args, turn, "garbage"):
                    print("this is not json", flush=True)
                    continue
                text, reward, done, info = session.step(request["action"])
                reply.update(observation=text, reward=reward, done=done,
                             success=session.success, info=info)
            elif op == "snapshot":
                reply["state"] = session.state()
            elif op == "restore":
                session = session or ReachSession(1, 0, "sparse", 0)
                session.restore(request["state"])
            elif op == "expert":
                reply["action"] = session.expert(request["error_rate"], request["seed"])
            elif op == "close":
                return
            else:
                reply = {"id": request.get("id"), "ok": False, "error": "unknown op %r" % op}
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            reply = {"id": request.get("id"), "ok": False, "error": "%s: %s" % (type(error).__name__, error)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
