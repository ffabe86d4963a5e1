// What the job detail page knows about a job beyond the generated schema, and small helpers.
export type { Job } from "../../api/client";

import type { Job } from "../../api/client";
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
  if (p.total_steps == null) {
    const later = isTerminal(job.status) ? "" : " · time left known after epoch 1";
    return `epoch ${p.epoch}/${p.epochs} · step ${p.steps_done}${later}`;
  }
  if (p.steps_done >= p.total_steps) return `trained: ${p.total_steps} of ${p.total_steps} steps`;
  const left = p.eta_seconds && !isTerminal(job.status) ? ` · about ${duration(p.eta_seconds)} left` : "";
  return `epoch ${p.epoch}/${p.epochs} · step ${p.steps_done} of ${p.total_steps} (${p.percent}%)${left}`;
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
