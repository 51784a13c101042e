#!/usr/bin/env node
// Entry point: runs the compiled CLI (npm run build writes dist/).
import { main } from '../dist/src/cli/main.js';
main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (err) => { console.error(err?.stack ?? String(err)); process.exitCode = 1; },
);
