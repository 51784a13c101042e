# Shared by the GPU benchmark scripts (sourced, run ON the GPU machine from the repo root with dist/ and .devmods/
# carried): links node_modules to the trimmed run-time modules, and defines
#   used            device memory in use now (MiB, nvidia-smi);
#   peak_of CMD...  runs CMD while sampling nvidia-smi every 100 ms; prints "rc peak_MiB_over_the_baseline";
#   busy_clocks     with CLOCKS=1, of the last peak_of's samples drawing over 300 W (the GPU at work): their count and the
#                   median SM clock (MHz) and power (W), as JSON (else nothing). Off by default, so that timings are
#                   taken as before: whether querying clocks and power every 100 ms disturbs a run was not established
#                   (session 13: a cached step read 85 ms with it, 82 without, 76 in an earlier call);
#   step_metrics F  from a run's metrics.jsonl: ms/step and tokens/s over steps 2..last, the median and the largest of
#                   the steps' own times (step_ms) from step 3, first and last loss (JSON);
#   say TEXT...     prints TEXT and appends it to $txt (the script's report);
#   say_device      the device line of a report (GPU, memory, driver; node's version);
#   report_run LABEL LOG METRICS RC MIB [EXTRA...]
#                   a distillation run's report: "== LABEL: rc peak step_metrics EXTRA", then its log's kernel-cache and
#                   error lines (REPORT_HEAD, default '^\[kernel-cache\] (pre-warm|miss)|rror', at most 6), its CUDA
#                   timeline and graph lines (REPORT_TIMELINE, default '^\[cuda-(timeline|graphs)\]'), and the log's
#                   tail when RC is not 0.
# Expects $work (a scratch folder) and $txt (the report file) to be set.
[ -e node_modules ] || ln -sfn .devmods/node_modules node_modules
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
peak_of() {
  local base; base=$(used)
  nvidia-smi --query-gpu=memory.used$([ "${CLOCKS:-}" = 1 ] && echo ,clocks.sm,power.draw) --format=csv,noheader,nounits -lms 100 > "$work/smi.txt" 2>/dev/null &
  local smi=$!
  "$@"; local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  local peak; peak=$(cut -d, -f1 "$work/smi.txt" | sort -n | tail -1)
  echo "$rc $(( ${peak:-$base} - base ))"
}
busy_clocks() {
  [ "${CLOCKS:-}" = 1 ] || return 0
  node -e '
    const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => l.split(",").map(Number))
      .filter((r) => r.length === 3 && r[2] > 300);
    const med = (a) => a.sort((x, y) => x - y)[Math.floor((a.length - 1) / 2)];
    console.log("clocks " + (rows.length ? JSON.stringify({ busy_samples: rows.length, sm_mhz_median: med(rows.map((r) => r[1])), power_w_median: Math.round(med(rows.map((r) => r[2]))) }) : "{}"));
  ' "$work/smi.txt"
}
step_metrics() {
  node -e '
    const fs = require("fs");
    let rows = [];
    try { rows = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.loss !== undefined); } catch {}
    if (rows.length < 4) { console.log("{}"); process.exit(0); }
    const a = rows[1], z = rows[rows.length - 1];
    // the median of the step times (step_ms, from the third step): a one-off host pause moves the mean, not this
    const own = rows.slice(2).map((r) => r.step_ms).filter((x) => typeof x === "number").sort((x, y) => x - y);
    console.log(JSON.stringify({ ms_per_step: +(1000 * (z.seconds - a.seconds) / (z.step - a.step)).toFixed(1),
      tokens_per_s: Math.round((z.tokens - a.tokens) / (z.seconds - a.seconds)),
      ...(own.length ? { step_ms_median: own[Math.floor((own.length - 1) / 2)], step_ms_max: own[own.length - 1] } : {}),
      loss_first: rows[0].loss, loss_last: z.loss }));
  ' "$1"
}
say() { echo "$*" | tee -a "$txt"; }
say_device() { say "== device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1); node $(node --version)"; }
report_run() {
  local label=$1 log=$2 metrics=$3 rc=$4 mib=$5; shift 5
  say "== $label: rc=$rc peak ${mib} MiB (nvidia-smi) $(step_metrics "$metrics")${*:+ $*}"
  grep -E "${REPORT_HEAD:-^\[kernel-cache\] (pre-warm|miss)|rror}" "$log" | head -6 | tee -a "$txt"
  grep -E "${REPORT_TIMELINE:-^\[cuda-(timeline|graphs)\]}" "$log" | tee -a "$txt"
  [ "$rc" != 0 ] && tail -15 "$log" | tee -a "$txt"
  return 0
}
