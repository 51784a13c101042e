# Sourced by the transformers-compatibility wrappers (hf-writes.sh, hf-generate.sh, lora-check.sh) with a name: stops at
# the first error, runs from the repo root, makes a fresh scratch folder $w (WORK, else /tmp/distillery-<name>) and caches
# kernels in it unless DISTILLERY_CACHE_DIR says otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
w=${WORK:-/tmp/distillery-$1}; rm -rf "$w"; mkdir -p "$w"
export DISTILLERY_CACHE_DIR="${DISTILLERY_CACHE_DIR:-$w/kernels}"
