// What the job detail page knows about a job beyond the generated schema, and small helpers.
export type { Job } from "../../api/client";

export { isTerminal } from "../../components/status";

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
  logs: (id: string) => ["job", id, "logs"] as const,
  plan: (id: string) => ["job", id, "plan"] as const,
};
