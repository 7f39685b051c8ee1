# moerl report: the HTML page with PNG plots of a run. A tiny 4-rank job
# (40 steps, shaped rewards) is reported while it runs (the page must say
# "run in progress") and after its end; every plot must exist and be a real
# picture, the page must reference each by a relative name, and the numbers
# of its before/after table must equal summary.json's. Headless Chromium
# (Debian's chromium, which scripts/setup.sh installs) must render the page:
# its screenshot must show the plots, and its DOM must hold every <img>. A
# metrics file with a half-written last line and a line without most keys
# (a job writing as the report reads) must still give a page; a directory
# that is not a run must give a non-zero status and a message naming it.
source "$(dirname "$0")/lib.sh" "$@"
PY=/usr/bin/python3  # Debian's interpreter: python3-matplotlib and python3-pil belong to it
[ -x "$PY" ] || { fail "$PY is missing (moerl report runs Debian's python3)"; finish; }
"$PY" -c "import matplotlib" 2>/dev/null ||
  { fail "matplotlib is not installed for $PY (apt-get install python3-matplotlib; scripts/setup.sh installs it)"; finish; }
command -v chromium >/dev/null ||
  { fail "chromium is not installed (apt-get install chromium; scripts/setup.sh installs it)"; finish; }

# Not a run directory: a missing one and one without metrics.jsonl.
"$MOERL" report "$WORK/no_such_run" >bad1.txt 2>&1
status=$?
[ "$status" -ne 0 ] || fail "report of a missing directory: exit status 0"
expect_contains bad1.txt "$WORK/no_such_run" "the message names the missing directory"
mkdir -p "$WORK/not_a_run"
"$MOERL" report "$WORK/not_a_run" >bad2.txt 2>&1
status=$?
[ "$status" -ne 0 ] || fail "report of a directory without metrics.jsonl: exit status 0"
expect_contains bad2.txt "$WORK/not_a_run is not a run directory" "the message names the directory"
expect_contains bad2.txt "metrics.jsonl" "the message says what is missing"

pretrain_tiny
[ "$failures" -eq 0 ] || finish
STEPS=40
RUN="$WORK/runs/report"
"${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set run.name=report --set optim.total_steps=$STEPS \
  --set env.shaping=shaped --set checkpoint.every_steps=10 --init "$TINY_BASE" >train.txt 2>&1 &
job=$!
# Mid-run: the job appends to metrics.jsonl as the report reads it.
if wait_for_line train.txt "step 15/$STEPS " 120; then
  [ -e "$RUN/summary.json" ] && fail "the job ended before the mid-run report (summary.json exists at step 15)"
  started=$SECONDS
  "$MOERL" report "$RUN" >mid.txt 2>&1
  expect_status 0 $? "report while the job runs"
  echo "mid-run report: $((SECONDS - started)) s"
  expect_contains mid.txt "run in progress" "the mid-run report says so"
  expect_contains "$RUN/report/index.html" 'id="status">run in progress' "the mid-run page says so"
  expect_contains "$RUN/report/index.html" '<table id="latest">' "the mid-run page shows the latest evaluation"
else
  fail "the job never reached step 15"
fi
wait_job $job 180 "training job"
status=$?
expect_status 0 $status "training job"
[ "$status" -eq 0 ] || { tail -n 30 train.txt | sed 's/^/    | /'; finish; }

started=$SECONDS
"$MOERL" report "$RUN" >final.txt 2>&1
expect_status 0 $? "report after the end"
echo "final report: $((SECONDS - started)) s"
expect_contains final.txt "run finished" "the final report says the run finished"
[ "$(tail -n 1 final.txt)" = "$RUN/report/index.html" ] ||
  { fail "the report's last line is not the path of index.html"; sed 's/^/    | /' final.txt; }

# The page and its pictures, and the table against summary.json.
"$PY" - "$RUN" <<'PY' || fail "the final report's page, plots or table"
import html.parser, json, os, struct, sys
run = sys.argv[1]
out = os.path.join(run, "report")
summary = json.load(open(os.path.join(run, "summary.json")))
families = sorted(summary["before"])
expected = {"learning_%s.png" % f for f in families} | {"throughput.png", "staleness.png", "sync.png",
            "env_latency.png", "expert_load.png", "events.png", "memory.png"}
try:
    from PIL import Image
except ImportError:
    Image = None
problems = []
for name in sorted(expected):
    path = os.path.join(out, name)
    if not os.path.isfile(path):
        problems.append("%s is missing" % name)
        continue
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        problems.append("%s is not a PNG" % name)
        continue
    width, height = struct.unpack(">II", data[16:24])
    if len(data) < 8000 or width < 400 or height < 200:
        problems.append("%s is trivial: %d bytes, %dx%d" % (name, len(data), width, height))
    if Image:
        colors = Image.open(path).convert("RGB").getcolors(1 << 20)
        if colors is None or len(colors) < 20:
            problems.append("%s has %s colours: nothing drawn" % (name, len(colors or [])))

class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.values, self.key, self.text = [], {}, None, ""
    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src"))
        if "data-key" in attrs:
            self.key, self.text = attrs["data-key"], ""
            self.values[self.key] = [float(attrs["data-value"]), None]
    def handle_data(self, data):
        if self.key:
            self.text += data
    def handle_endtag(self, tag):
        if self.key and tag == "span":
            self.values[self.key][1] = self.text
            self.key = None
page = Page()
text = open(os.path.join(out, "index.html")).read()
page.feed(text)
if 'id="status">run finished' not in text:
    problems.append("the page does not say the run finished")
if "No plot:" in text:
    problems.append("a plot without data in a finished run")
if set(page.images) != expected:
    problems.append("the page's images %s, expected %s" % (sorted(page.images), sorted(expected)))
for src in page.images:
    if os.path.isabs(src) or "/" in src or not os.path.isfile(os.path.join(out, src)):
        problems.append("<img src=%r> is not a file next to index.html" % src)
# Every number of the before/after table equals summary.json's, and reads as it should.
wanted = set()
for phase in ("before", "after", "before_greedy", "after_greedy"):
    for f in families:
        wanted |= {"%s.%s.%s" % (phase, f, k) for k in ("success", "ci_low", "ci_high")}
for phase in ("gain", "gain_greedy"):
    for f in families:
        wanted |= {"%s.%s.%s" % (phase, f, k) for k in ("value", "ci_low", "ci_high")}
if not wanted <= set(page.values):
    problems.append("the table lacks %s" % sorted(wanted - set(page.values)))
for key, (value, shown) in sorted(page.values.items()):
    phase, family, field = key.split(".")
    truth = summary[phase][family][field]
    if value != truth:
        problems.append("table %s = %r, summary.json %r" % (key, value, truth))
    display = ("%+.1f" if phase.startswith("gain") else "%.1f%%") % (100 * truth)
    if shown != display:
        problems.append("table %s reads %r, expected %r" % (key, shown, display))
print("checked %d plots, %d table numbers (PIL %s)" % (len(expected), len(page.values), "used" if Image else "absent"))
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
PY

# Headless Chromium renders the page with its pictures.
CHROME=(timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$WORK/chrome" --window-size=1200,3000)
started=$SECONDS
"${CHROME[@]}" --screenshot="$WORK/shot.png" "file://$RUN/report/index.html" >chrome_shot.txt 2>&1
# Chromium's complaints about a missing D-Bus are noise here.
[ -s "$WORK/shot.png" ] || { fail "chromium wrote no screenshot"; grep -v dbus chrome_shot.txt | tail -n 20 | sed 's/^/    | /'; }
"${CHROME[@]}" --dump-dom "file://$RUN/report/index.html" >dom.html 2>chrome_dom.txt
status=$?
expect_status 0 $status "chromium --dump-dom"
[ "$status" -eq 0 ] || grep -v dbus chrome_dom.txt | tail -n 20 | sed 's/^/    | /'
echo "chromium: $((SECONDS - started)) s"
"$PY" - "$WORK/shot.png" dom.html "$RUN/report" <<'PY' || fail "the page as Chromium renders it"
import html.parser, os, struct, sys
shot, dom, out = sys.argv[1:]
problems = []
data = open(shot, "rb").read() if os.path.exists(shot) else b""
if data[:8] != b"\x89PNG\r\n\x1a\n":
    problems.append("the screenshot is not a PNG")
else:
    width, height = struct.unpack(">II", data[16:24])
    try:
        from PIL import Image
    except ImportError:
        Image = None
    if Image:
        img = Image.open(shot).convert("RGB")
        pixels = list(img.getdata())
        ink = sum(1 for p in pixels if min(p) < 230)
        colored = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 60)
        print("screenshot %dx%d: %.1f%% ink, %.2f%% coloured" % (width, height, 100.0 * ink / len(pixels),
                                                               100.0 * colored / len(pixels)))
        if ink < 0.03 * len(pixels):
            problems.append("the screenshot is blank (%d of %d pixels not white)" % (ink, len(pixels)))
        if colored < 0.001 * len(pixels):
            problems.append("the screenshot shows no plots (%d coloured pixels)" % colored)
    else:
        # Without PIL: a blank 1200x3000 page compresses to a few kB.
        print("screenshot %dx%d, %d bytes (no PIL)" % (width, height, len(data)))
        if len(data) < 60000:
            problems.append("the screenshot is %d bytes: blank" % len(data))
class Images(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.src = []
    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.src.append(dict(attrs).get("src"))
parser = Images()
parser.feed(open(dom).read())
files = sorted(n for n in os.listdir(out) if n.endswith(".png"))
if sorted(parser.src) != files:
    problems.append("Chromium's DOM has images %s, the report directory %s" % (sorted(parser.src), files))
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
PY

# A job writing as the report reads: a line without most keys, then half a line; no summary.json yet.
mkdir -p "$WORK/partial"
cp "$RUN/metrics.jsonl" "$WORK/partial/"
echo '{"step": 41, "roles": {"learner": {}}}' >>"$WORK/partial/metrics.jsonl"
tail -n 2 "$RUN/metrics.jsonl" | head -n 1 | head -c 300 >>"$WORK/partial/metrics.jsonl"
"$MOERL" report "$WORK/partial" --out "$WORK/partial_report" >partial.txt 2>&1
expect_status 0 $? "report of a metrics file with a half-written last line"
expect_contains partial.txt "run in progress" "without summary.json the run is in progress"
expect_contains partial.txt "still being written" "the half-written line is left out and said so"
expect_contains partial.txt "$WORK/partial_report/index.html" "--out is where the page goes"
[ -s "$WORK/partial_report/learning_arithmetic.png" ] || fail "--out: no learning curve in $WORK/partial_report"
finish
