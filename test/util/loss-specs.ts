/** One LossSpec per loss kind, with non-trivial alpha, temperature and beta: the model-level gradient tests iterate them. */
import type { LossSpec } from '../../src/backend/backend.js';

export const LOSS_SPECS: readonly LossSpec[] = [
  { kind: 'none', alpha: 0, temperature: 1, beta: 0.5 },
  { kind: 'kl', alpha: 0.7, temperature: 2, beta: 0.5 },
  { kind: 'reverse-kl', alpha: 0.5, temperature: 1.5, beta: 0.5 },
  { kind: 'jsd', alpha: 0.9, temperature: 1, beta: 0.3 },
];
