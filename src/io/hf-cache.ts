/**
 * Hub ids (`Qwen/Qwen2.5-0.5B`, `Qwen/Qwen2.5-0.5B@<revision>`) resolved in the local Hugging Face cache, offline.
 *
 * The cache layout (huggingface_hub): `<hub cache>/models--<owner>--<name>/refs/<branch>` holds a commit hash and
 * `snapshots/<commit>/` holds the files. The hub cache folders looked in, in order: `$HF_HUB_CACHE`
 * (also the older `$HUGGINGFACE_HUB_CACHE`), `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
 * `~/.cache/huggingface/hub`. Without a revision, `refs/main` names the snapshot (a cache with no refs/main
 * and exactly one snapshot uses that one); `@rev` is a branch or tag under refs/, or a commit hash (a prefix of
 * 7 or more hex digits is accepted when exactly one snapshot matches). distillery never downloads.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

/** `owner/name` or `owner/name@revision` (a revision may hold `/`, e.g. refs/pr/1, but no `..`). */
const HUB_ID = /^([A-Za-z0-9][A-Za-z0-9._-]*)\/([A-Za-z0-9][A-Za-z0-9._-]*)(?:@([A-Za-z0-9][A-Za-z0-9._/-]*))?$/;

/** True when s has the shape of a Hub model id (it may still be a local path: callers check the disk first). */
export function looksLikeHubId(s: string): boolean {
  const m = HUB_ID.exec(s);
  // A file name (config.json, model.safetensors) is a path the user mistyped, not a repository.
  return m !== null && !s.includes('..') && !(m[3] ?? '').endsWith('/') && !/\.(json|safetensors|txt|jsonl|md)$/i.test(m[2]!);
}

/** The hub cache folders to search, in order (see the module comment); duplicates removed. */
export function hubCacheDirs(env: NodeJS.ProcessEnv = process.env, home = os.homedir()): string[] {
  const dirs: string[] = [];
  if (env.HF_HUB_CACHE) dirs.push(env.HF_HUB_CACHE);
  if (env.HUGGINGFACE_HUB_CACHE) dirs.push(env.HUGGINGFACE_HUB_CACHE);
  if (env.HF_HOME) dirs.push(path.join(env.HF_HOME, 'hub'));
  if (env.XDG_CACHE_HOME) dirs.push(path.join(env.XDG_CACHE_HOME, 'huggingface', 'hub'));
  dirs.push(path.join(home, '.cache', 'huggingface', 'hub'));
  return [...new Set(dirs.map((d) => path.resolve(d)))];
}

export type HubResolution =
  | { ok: true; dir: string; revision: string }
  | { ok: false; message: string; hint: string };

function readRef(file: string): string | null {
  try {
    const s = fs.readFileSync(file, 'utf8').trim();
    return /^[0-9a-f]{7,64}$/i.test(s) ? s : null;
  } catch {
    return null;
  }
}

function snapshotsOf(repoDir: string): string[] {
  try {
    return fs.readdirSync(path.join(repoDir, 'snapshots')).filter((n) => fs.statSync(path.join(repoDir, 'snapshots', n)).isDirectory()).sort();
  } catch {
    return [];
  }
}

/** Finds a Hub model in the local cache (no network). `id` must satisfy looksLikeHubId. */
export function resolveHubModel(id: string, env: NodeJS.ProcessEnv = process.env, home = os.homedir()): HubResolution {
  const m = HUB_ID.exec(id);
  if (!m || !looksLikeHubId(id)) return { ok: false, message: `${id} is not a Hugging Face model id (owner/name[@revision])`, hint: 'pass a local model folder or an id like Qwen/Qwen2.5-0.5B' };
  const [, owner, name, rev] = m as unknown as [string, string, string, string | undefined];
  const repo = `models--${owner}--${name}`;
  const dirs = hubCacheDirs(env, home);
  const looked: string[] = [];
  for (const d of dirs) {
    const repoDir = path.join(d, repo);
    looked.push(repoDir);
    if (!fs.existsSync(repoDir)) continue;
    const snaps = snapshotsOf(repoDir);
    let commit: string | null = null;
    if (rev === undefined) {
      commit = readRef(path.join(repoDir, 'refs', 'main'));
      if (commit === null && snaps.length === 1) commit = snaps[0]!;
    } else {
      commit = readRef(path.join(repoDir, 'refs', rev));
      if (commit === null && /^[0-9a-f]{7,64}$/i.test(rev)) {
        const hits = snaps.filter((s) => s.startsWith(rev.toLowerCase()));
        if (hits.length === 1) commit = hits[0]!;
      }
    }
    if (commit === null) continue;
    const snap = path.join(repoDir, 'snapshots', commit);
    if (fs.existsSync(path.join(snap, 'config.json'))) return { ok: true, dir: snap, revision: commit };
  }
  const what = rev === undefined ? id : `${owner}/${name} at revision ${rev}`;
  return {
    ok: false,
    message: `${what} is not a local folder and is not in the local Hugging Face cache (looked in ${looked.join(', ')}); distillery does not download models`,
    hint: `download it first (e.g. \`hf download ${owner}/${name}${rev !== undefined ? ` --revision ${rev}` : ''}\` or \`huggingface-cli download ${owner}/${name}\`), set HF_HUB_CACHE or HF_HOME to the cache that has it, or pass a local folder`,
  };
}

/**
 * The Hub id a local cache snapshot folder is of (`…/models--Qwen--Qwen2.5-0.5B/snapshots/<commit>` → `Qwen/Qwen2.5-0.5B`),
 * or null for any other folder: what a LoRA adapter names as its base, as PEFT does.
 */
export function hubIdOfSnapshot(dir: string): string | null {
  const parts = path.resolve(dir).split(path.sep);
  const i = parts.lastIndexOf('snapshots');
  if (i < 1 || i !== parts.length - 2) return null;
  const m = /^models--([^/]+?)--(.+)$/.exec(parts[i - 1]!);
  return m ? `${m[1]}/${m[2]}` : null;
}
