// What the job detail page knows about a job beyond the generated schema, and small helpers.
export type { Job } from "../../api/client";

import type { Job, Schemas } from "../../api/client";
import { isTerminal } from "../../components/status";
import { duration } from "../../components/time";

export { isTerminal };

/**
 * A served evaluation (job.evaluation, checkpoint.evaluation; workers/pipeline/evaluate.py):
 * what serving the drafter measured, its baselines, and the trainer's estimate, labelled.
 */
export interface Evaluation {
  checkpoint_id?: string;
  epoch?: number;
  mean_acceptance_length?: number | null;
  ngram_mean_acceptance_length?: number | null;
  speedup?: number | null;
  ngram_speedup?: number | null;
  beats_ngram?: boolean | null;
  outputs_identical_to_baseline?: string | null;
  prompts?: number;
  prompt_source?: string;
  trainer_eal_estimate?: number | null;
  served_vs_trainer_eal?: number | null;
  warnings?: string[] | null;
  acceptance_rate_per_position?: number[] | null;
  output_tokens_per_s?: number | null;
  baseline_output_tokens_per_s?: number | null;
  engine?: string;
  selected?: boolean;
  candidate?: string; // the candidate it is of (a bake-off's winner, or its best ranked)
  kind?: string;
  speedup_spread?: number | null;
  lossless?: boolean | null;
  rounds?: number | null;
}

export const evaluationOf = (value: unknown): Evaluation | null =>
  value && typeof value === "object" ? (value as Evaluation) : null;

/** An epoch as people count it, from 1 (as the progress shows it): the API, the trainer and
 * the checkpoints number epochs from 0. */
export const epochOf = (epoch: number | null | undefined): string => (epoch == null ? "?" : String(epoch + 1));

/** A number for people: at most `digits` decimals, "—" for nothing. */
export function num(value: number | null | undefined, digits = 3): string {
  if (value == null || !Number.isFinite(value)) return "—";
  return value.toLocaleString("en-US", { maximumFractionDigits: digits });
}

/** Query keys of this page; ["job", id] alone is the job. */
export const keys = {
  job: (id: string) => ["job", id] as const,
  metrics: (id: string) => ["job", id, "metrics"] as const,
  checkpoints: (id: string) => ["job", id, "checkpoints"] as const,
  plan: (id: string) => ["job", id, "plan"] as const,
};

/** Where training is (JobOut.progress: epoch counted from 1; the total known once the first
 * epoch is trained): "epoch 2/2 · step 45 of 62 (73%) · about 20s left", or "trained: 62 of 62
 * steps" once it is done. */
export function progressOf(job: Job): string | null {
  const p = job.progress;
  if (!p) return null;
  // A bake-off trains its candidates one after another: say whose progress this is.
  const at = p.candidate != null ? job.candidates.findIndex((c) => c.name === p.candidate) : -1;
  const who = p.candidate != null ? `${p.candidate}${at >= 0 ? ` (${at + 1} of ${job.candidates.length})` : ""} · ` : "";
  if (p.total_steps == null) {
    const later = isTerminal(job.status) ? "" : " · time left known after epoch 1";
    return `${who}epoch ${p.epoch}/${p.epochs} · step ${p.steps_done}${later}`;
  }
  if (p.steps_done >= p.total_steps) return `${who}trained: ${p.total_steps} of ${p.total_steps} steps`;
  const left = p.eta_seconds && !isTerminal(job.status) ? ` · about ${duration(p.eta_seconds)} left` : "";
  return `${who}epoch ${p.epoch}/${p.epochs} · step ${p.steps_done} of ${p.total_steps} (${p.percent}%)${left}`;
}

/** The progress of the stage under way after training (JobOut.stage_progress: the served
 * evaluation), or null: "serving the trained drafter: prompt 3 of 8 done · 5 of 18 steps (27%) ·
 * about 12s left". */
export function stageProgressOf(job: Job): { text: string; done: number; total: number } | null {
  const p = job.stage_progress;
  if (!p || isTerminal(job.status) || p.stage !== job.stage) return null;
  const left = p.eta_seconds ? ` · about ${duration(p.eta_seconds)} left` : "";
  return {
    text: `${p.what} · ${p.steps_done} of ${p.total_steps} steps (${p.percent}%)${left}`,
    done: p.steps_done,
    total: p.total_steps,
  };
}

/** The stages this job runs, in order (app/services/state.py's Stage; workers/pipeline). */
export const STAGE_NAMES: Record<string, string> = {
  regenerating_data: "Regenerate data",
  starting_verifier: "Start verifier",
  preparing_data: "Prepare data",
  training: "Train",
  evaluating: "Evaluate",
  publishing: "Publish",
  deploying: "Deploy",
};

export function stagesOf(job: Job): string[] {
  return [
    ...(job.data?.regenerate ? ["regenerating_data"] : []),
    "starting_verifier",
    "preparing_data",
    "training",
    ...(job.evaluate !== false ? ["evaluating"] : []),
    ...(job.publish ? ["publishing"] : []),
    ...(job.deploy ? ["deploying"] : []),
  ];
}

/** Each stage's state: done, the current one, not yet (or never, once the job ended). */
export function stageStates(job: Job): { stage: string; state: "done" | "current" | "pending" }[] {
  const stages = stagesOf(job);
  const at = job.stage ? stages.indexOf(job.stage) : -1;
  return stages.map((stage, i) => ({
    stage,
    state:
      job.status === "succeeded" || (at >= 0 && i < at)
        ? "done"
        : i === at && !isTerminal(job.status)
          ? "current"
          : "pending",
  }));
}

// ---------------------------------------------------------------------------------------------
// Drafter kinds and a bake-off's candidates (JobOut.candidates, evaluation.leaderboard)
// ---------------------------------------------------------------------------------------------

export type Candidate = Schemas["CandidateOut"];
export type Kind = "dflash" | "dflash2" | "dspark" | "eagle3";

/** The kinds speculators trains and vLLM serves (app/schemas/drafters.py KINDS). */
export const KINDS: { kind: Kind; label: string; block: boolean; cpu: boolean }[] = [
  { kind: "dflash", label: "DFlash", block: true, cpu: true },
  { kind: "dflash2", label: "DFlash 2", block: true, cpu: false },
  { kind: "dspark", label: "DSpark", block: true, cpu: false },
  { kind: "eagle3", label: "EAGLE-3", block: false, cpu: true },
];

/** Whether a kind drafts a block (has block_size and max_anchors): the DFlash family. */
export const isBlockKind = (kind: string) => KINDS.find((k) => k.kind === kind)?.block ?? true;

/** A job that trains several drafters and ranks them (a plain job has one candidate). */
export const isBakeoff = (job: Job) => job.candidates.length > 1;

/** The leaderboard of a bake-off's evaluation (job.evaluation.leaderboard). */
export interface Leaderboard {
  winner?: string | null;
  ranking?: string[];
  rounds?: number | null;
  baselines?: {
    no_speculation?: number | null; // output tokens/s of the verifier alone
    ngram?: number | null; // output tokens/s with n-gram drafting
    ngram_speedup?: number | null;
    ngram_mean_acceptance_length?: number | null;
  };
}

export function leaderboardOf(job: Job): Leaderboard | null {
  const board = (job.evaluation as { leaderboard?: unknown } | null)?.leaderboard;
  return board && typeof board === "object" ? (board as Leaderboard) : null;
}

/** What a candidate's training cost, in the unit that matters on its runtime: CPU seconds on
 * the local runtime, GPU seconds on vllm, else the trainer's wall time. */
export function costOf(candidate: Candidate, runtime: string): { seconds: number; unit: string } | null {
  if (runtime === "local" && candidate.train_cpu_seconds != null) return { seconds: candidate.train_cpu_seconds, unit: "CPU s" };
  if (runtime === "vllm" && candidate.train_gpu_seconds != null) return { seconds: candidate.train_gpu_seconds, unit: "GPU s" };
  if (candidate.train_seconds != null) return { seconds: candidate.train_seconds, unit: "wall s" };
  return null;
}

/** The unit of a job's training cost axis: that of its candidates' costs. */
export function costUnit(job: Job): string {
  return job.candidates.map((c) => costOf(c, job.runtime)?.unit).find(Boolean) ?? (job.runtime === "local" ? "CPU s" : job.runtime === "vllm" ? "GPU s" : "wall s");
}

/** The candidates in leaderboard order: ranked ones by rank, then the others as the job lists them. */
export function byRank(candidates: Candidate[]): Candidate[] {
  return [...candidates].sort((a, b) => (a.rank ?? Infinity) - (b.rank ?? Infinity) || a.index - b.index);
}

/** The checkpoint to deploy for a candidate: the one its evaluation chose, else its trainer's
 * best (from the job's checkpoints, when given), else its latest. */
export function deployableCheckpoint(
  candidate: Candidate,
  checkpoints?: Schemas["CheckpointOut"][],
): string | null {
  if (candidate.checkpoint_id) return candidate.checkpoint_id;
  const own = (checkpoints ?? []).filter((c) => c.candidate === candidate.index && !c.partial);
  const best = own.find((c) => c.is_best);
  if (best) return best.id;
  return candidate.checkpoint_ids.length ? candidate.checkpoint_ids[candidate.checkpoint_ids.length - 1] : null;
}

/** A drafter's settings in a few words: "block 8 · 2 layers · 2 epochs · lr 0.003". */
export function settingsText(settings: Record<string, unknown>, kind: string): string {
  const parts: string[] = [];
  if (isBlockKind(kind) && settings.block_size != null) parts.push(`block ${String(settings.block_size)}`);
  if (kind === "eagle3" && settings.ttt_steps != null) parts.push(`${String(settings.ttt_steps)} TTT steps`);
  if (settings.num_layers != null) parts.push(`${String(settings.num_layers)} layer${settings.num_layers === 1 ? "" : "s"}`);
  if (settings.epochs != null) parts.push(`${String(settings.epochs)} epoch${settings.epochs === 1 ? "" : "s"}`);
  if (settings.lr != null) parts.push(`lr ${String(settings.lr)}`);
  return parts.join(" · ");
}
