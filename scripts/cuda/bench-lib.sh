# Shared by the GPU benchmark scripts (sourced, run ON the GPU machine from the repo root with dist/ and .devmods/
# carried): links node_modules to the trimmed run-time modules, and defines
#   used            device memory in use now (MiB, nvidia-smi);
#   peak_of CMD...  runs CMD while sampling nvidia-smi every 100 ms; prints "rc peak_MiB_over_the_baseline";
#   step_metrics F  from a run's metrics.jsonl: ms/step and tokens/s over steps 2..last, first and last loss (JSON).
# Expects $work (a scratch folder) to be set.
[ -e node_modules ] || ln -sfn .devmods/node_modules node_modules
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
peak_of() {
  local base; base=$(used)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/smi.txt" 2>/dev/null &
  local smi=$!
  "$@"; local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  local peak; peak=$(sort -n "$work/smi.txt" | tail -1)
  echo "$rc $(( ${peak:-$base} - base ))"
}
step_metrics() {
  node -e '
    const fs = require("fs");
    let rows = [];
    try { rows = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse).filter((r) => r.loss !== undefined); } catch {}
    if (rows.length < 4) { console.log("{}"); process.exit(0); }
    const a = rows[1], z = rows[rows.length - 1];
    console.log(JSON.stringify({ ms_per_step: +(1000 * (z.seconds - a.seconds) / (z.step - a.step)).toFixed(1),
      tokens_per_s: Math.round((z.tokens - a.tokens) / (z.seconds - a.seconds)), loss_first: rows[0].loss, loss_last: z.loss }));
  ' "$1"
}
