// The new-job form: its state, its client-side checks (the same limits as app/schemas/jobs.py
// JobCreate and SpeculatorSpec), and the one function that turns it into a JobCreate body.
import type { Job, JobCreate, Verifier } from "../../api/client";
import { ApiError, messageOf } from "../../api/errors";
import type { FieldErrors } from "../../components/form";

export type Runtime = "" | "local" | "vllm"; // "": the server's default
export type Mode = JobCreate["mode"];
export type Scheduler = "cosine" | "linear" | "none";
export type GateChoice = "default" | "none" | "custom";

export interface JobForm {
  name: string; // optional
  dataset: string;
  verifier: string;
  blockSize: string;
  numLayers: string;
  targetLayerIds: string; // comma-separated; empty: the verifier's default
  maxAnchors: string;
  seqLen: string;
  epochs: string;
  lr: string;
  scheduler: Scheduler;
  seed: string;
  mode: Mode;
  runtime: Runtime;
  tensorParallel: string;
  dataParallel: string;
  trainerGpus: string;
  shareGpus: boolean;
  evaluate: boolean;
  evalPrompts: string;
  evalMaxTokens: string;
  evalBaseline: boolean;
  evalNgram: boolean;
  gate: GateChoice;
  gateMinAL: string;
  gateMinSpeedup: string;
  gateBeatNgram: boolean;
  publish: string;
}

/** The API's defaults (an empty dataset and verifier: they have none). */
export const DEFAULTS: JobForm = {
  name: "",
  dataset: "",
  verifier: "",
  blockSize: "16",
  numLayers: "5",
  targetLayerIds: "",
  maxAnchors: "3072",
  seqLen: "8192",
  epochs: "20",
  lr: "0.001",
  scheduler: "cosine",
  seed: "42",
  mode: "online",
  runtime: "",
  tensorParallel: "1",
  dataParallel: "1",
  trainerGpus: "1",
  shareGpus: false,
  evaluate: true,
  evalPrompts: "8",
  evalMaxTokens: "64",
  evalBaseline: true,
  evalNgram: true,
  gate: "default",
  gateMinAL: "",
  gateMinSpeedup: "",
  gateBeatNgram: false,
  publish: "",
};

/** A quick job on the tiny demo verifier that `specdeck run` makes. */
export const DEMO: Partial<JobForm> = {
  verifier: "demo",
  blockSize: "8",
  numLayers: "2",
  targetLayerIds: "",
  maxAnchors: "32",
  seqLen: "512",
  epochs: "6",
  lr: "0.003",
  runtime: "local",
};

interface NumberSpec {
  param: string;
  label: string;
  min: number;
  max: number;
  integer: boolean;
  minExclusive?: boolean;
  optional?: boolean;
}

type NumberKey =
  | "blockSize" | "numLayers" | "maxAnchors" | "seqLen" | "epochs" | "lr" | "seed"
  | "tensorParallel" | "dataParallel" | "trainerGpus" | "evalPrompts" | "evalMaxTokens"
  | "gateMinAL" | "gateMinSpeedup";

/** Every number input: the param the API names it by, its label, and its limits. */
export const NUMBERS: Record<NumberKey, NumberSpec> = {
  blockSize: { param: "speculator.block_size", label: "Block size", min: 2, max: 64, integer: true },
  numLayers: { param: "speculator.num_layers", label: "Draft layers", min: 1, max: 32, integer: true },
  maxAnchors: { param: "speculator.max_anchors", label: "Max anchors", min: 1, max: 65536, integer: true },
  seqLen: { param: "speculator.total_seq_len", label: "Sequence length", min: 64, max: 262144, integer: true },
  epochs: { param: "speculator.epochs", label: "Epochs", min: 1, max: 1000, integer: true },
  lr: { param: "speculator.lr", label: "Learning rate", min: 0, minExclusive: true, max: 1, integer: false },
  seed: { param: "speculator.seed", label: "Seed", min: 0, max: 2 ** 31 - 1, integer: true },
  tensorParallel: {
    param: "resources.verifier.tensor_parallel_size",
    label: "Verifier tensor parallel size",
    min: 1,
    max: 64,
    integer: true,
  },
  dataParallel: {
    param: "resources.verifier.data_parallel_size",
    label: "Verifier data parallel size",
    min: 1,
    max: 64,
    integer: true,
  },
  trainerGpus: { param: "resources.trainer_gpus", label: "Trainer GPUs", min: 1, max: 64, integer: true },
  evalPrompts: { param: "evaluate.prompts", label: "Prompts", min: 1, max: 512, integer: true },
  evalMaxTokens: { param: "evaluate.max_tokens", label: "Max tokens", min: 1, max: 8192, integer: true },
  gateMinAL: {
    param: "gate.min_acceptance_length",
    label: "Min acceptance length",
    min: 1,
    max: 65,
    integer: false,
    optional: true,
  },
  gateMinSpeedup: {
    param: "gate.min_speedup",
    label: "Min speedup",
    min: 0,
    minExclusive: true,
    max: 100,
    integer: false,
    optional: true,
  },
};

export const P = {
  name: "name",
  dataset: "dataset",
  verifier: "verifier",
  targetLayerIds: "speculator.target_layer_ids",
  scheduler: "speculator.scheduler",
  mode: "mode",
  runtime: "runtime",
  shareGpus: "resources.share_verifier_gpus",
  evaluate: "evaluate",
  evalBaseline: "evaluate.baseline",
  evalNgram: "evaluate.ngram",
  gate: "gate",
  gateBeatNgram: "gate.beat_ngram",
  publish: "publish",
} as const;

/** Every param the form has a field for, for placing API errors. */
export const PARAMS: string[] = [...Object.values(P), ...Object.values(NUMBERS).map((n) => n.param)];

/** The DOM id of the field for a param. */
export const fieldId = (param: string) => `job-${param.replace(/\./g, "-")}`;

// app/schemas/jobs.py HF_REPO_ID, and RepoId's max_length.
const HF_REPO_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}\/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$/;
const REPO_MAX = 200;
const REF_MAX = 512; // VerifierRef, and JobCreate.dataset
const NAME_MAX = 100; // JobCreate.name

function parseNumber(text: string, spec: NumberSpec): number | null | string {
  const t = text.trim();
  if (t === "") return spec.optional ? null : "Required";
  const n = Number(t);
  if (!Number.isFinite(n)) return "Enter a number";
  if (spec.integer && !Number.isInteger(n)) return "Enter a whole number";
  if (spec.minExclusive ? n <= spec.min : n < spec.min)
    return spec.minExclusive ? `Must be more than ${spec.min}` : `At least ${spec.min}`;
  if (n > spec.max) return `At most ${spec.max}`;
  return n;
}

/** "2, 6, 9" as numbers, or a message. */
function parseLayerIds(text: string, layers: number | undefined): number[] | null | string {
  const t = text.trim();
  if (t === "") return null;
  const parts = t.split(",").map((s) => s.trim());
  if (parts.some((s) => !/^\d+$/.test(s))) return "Whole numbers separated by commas, such as 2, 6, 9";
  const ids = parts.map(Number);
  if (ids.length > 16) return "At most 16 layer ids";
  if (new Set(ids).size !== ids.length) return "Layer ids must be unique";
  if (ids.some((id, i) => i > 0 && id < ids[i - 1])) return "Layer ids must be sorted ascending";
  if (layers !== undefined && ids.some((id) => id <= 0 || id >= layers))
    return `Each id must lie in 0 < id < ${layers} (the verifier has ${layers} layers)`;
  return ids;
}

function activeNumbers(form: JobForm): NumberKey[] {
  return (Object.keys(NUMBERS) as NumberKey[]).filter((key) => {
    if (key === "evalPrompts" || key === "evalMaxTokens") return form.evaluate;
    if (key === "gateMinAL" || key === "gateMinSpeedup") return form.gate === "custom";
    if (key === "tensorParallel" || key === "dataParallel" || key === "trainerGpus") return form.runtime !== "local";
    return true;
  });
}

/** The client-side problems, by param. `verifier`: what the preview learnt of it, if anything. */
export function validate(form: JobForm, verifier?: Verifier): FieldErrors {
  const errors: FieldErrors = {};
  if (form.name.trim().length > NAME_MAX) errors[P.name] = `At most ${NAME_MAX} characters`;
  if (!form.dataset) errors[P.dataset] = "Choose a dataset, or upload one";
  const ref = form.verifier.trim();
  if (!ref) errors[P.verifier] = "Required: a Hub id such as org/name, or a directory under the models root";
  else if (ref.length > REF_MAX) errors[P.verifier] = `At most ${REF_MAX} characters`;
  for (const key of activeNumbers(form)) {
    const value = parseNumber(form[key], NUMBERS[key]);
    if (typeof value === "string") errors[NUMBERS[key].param] = value;
  }
  const ids = parseLayerIds(form.targetLayerIds, verifier?.num_hidden_layers);
  if (typeof ids === "string") errors[P.targetLayerIds] = ids;
  else if (ids === null && verifier && verifier.default_target_layer_ids === null)
    errors[P.targetLayerIds] = `This verifier has only ${verifier.num_hidden_layers} layers: name the layer ids`;
  const repo = form.publish.trim();
  if (repo && (repo.length > REPO_MAX || !HF_REPO_ID.test(repo)))
    errors[P.publish] = "A Hugging Face repo id such as org/name";
  if (form.gate === "custom" && !form.evaluate)
    errors[P.gate] = "A gate needs the evaluation: turn on “Evaluate after training”";
  return errors;
}

function num(form: JobForm, key: NumberKey): number {
  return Number(form[key].trim());
}

function optionalNum(form: JobForm, key: NumberKey): number | null {
  return form[key].trim() === "" ? null : num(form, key);
}

/** The POST /api/jobs body for a form that `validate` passes. */
export function buildBody(form: JobForm): JobCreate {
  const ids = parseLayerIds(form.targetLayerIds, undefined);
  const body: JobCreate = {
    dataset: form.dataset,
    verifier: form.verifier.trim(),
    speculator: {
      type: "dflash",
      block_size: num(form, "blockSize"),
      num_layers: num(form, "numLayers"),
      target_layer_ids: Array.isArray(ids) ? ids : null,
      max_anchors: num(form, "maxAnchors"),
      total_seq_len: num(form, "seqLen"),
      epochs: num(form, "epochs"),
      lr: num(form, "lr"),
      scheduler: form.scheduler,
      seed: num(form, "seed"),
    },
    mode: form.mode,
    // The local runtime has no GPUs to choose (the form hides the fields).
    ...(form.runtime === "local"
      ? {}
      : {
          resources: {
            verifier: {
              tensor_parallel_size: num(form, "tensorParallel"),
              data_parallel_size: num(form, "dataParallel"),
            },
            trainer_gpus: num(form, "trainerGpus"),
            share_verifier_gpus: form.shareGpus,
          },
        }),
    evaluate: form.evaluate
      ? {
          prompts: num(form, "evalPrompts"),
          max_tokens: num(form, "evalMaxTokens"),
          baseline: form.evalBaseline,
          ngram: form.evalNgram,
          checkpoints: "best",
        }
      : false,
  };
  if (form.name.trim()) body.name = form.name.trim();
  if (form.runtime) body.runtime = form.runtime;
  if (form.publish.trim()) body.publish = form.publish.trim();
  if (form.gate === "none") body.gate = false;
  if (form.gate === "custom")
    body.gate = {
      min_acceptance_length: optionalNum(form, "gateMinAL"),
      min_speedup: optionalNum(form, "gateMinSpeedup"),
      beat_ngram: form.gateBeatNgram,
    };
  return body;
}

/** A number or string setting of a job, as the form's text; `fallback` when it has none. */
function text(value: unknown, fallback: string): string {
  return typeof value === "number" || typeof value === "string" ? String(value) : fallback;
}

/**
 * The form for a copy of `job` ("Clone"): its dataset, verifier, speculator, runtime, resources,
 * evaluation, gate and publish target as stored (its gate as resolved: the default one shows as
 * custom values). Not carried over: a warm start and metadata, which the form has no field for.
 */
export function formOf(job: Job): JobForm {
  const spec = job.speculator as Record<string, unknown>;
  const resources = job.resources as { verifier?: Record<string, unknown>; trainer_gpus?: unknown; share_verifier_gpus?: unknown };
  const evaluate = job.evaluate === false ? null : (job.evaluate as Record<string, unknown>);
  const gate = job.gate as Record<string, unknown> | null;
  const ids = spec.target_layer_ids;
  return {
    name: job.name ? `${job.name} (clone)`.slice(0, NAME_MAX) : "",
    dataset: job.dataset,
    verifier: job.verifier,
    blockSize: text(spec.block_size, DEFAULTS.blockSize),
    numLayers: text(spec.num_layers, DEFAULTS.numLayers),
    targetLayerIds: Array.isArray(ids) ? ids.join(", ") : "",
    maxAnchors: text(spec.max_anchors, DEFAULTS.maxAnchors),
    seqLen: text(spec.total_seq_len, DEFAULTS.seqLen),
    epochs: text(spec.epochs, DEFAULTS.epochs),
    lr: text(spec.lr, DEFAULTS.lr),
    scheduler: (text(spec.scheduler, DEFAULTS.scheduler) as Scheduler),
    seed: text(spec.seed, DEFAULTS.seed),
    mode: job.mode as Mode,
    runtime: job.runtime as Runtime,
    tensorParallel: text(resources.verifier?.tensor_parallel_size, DEFAULTS.tensorParallel),
    dataParallel: text(resources.verifier?.data_parallel_size, DEFAULTS.dataParallel),
    trainerGpus: text(resources.trainer_gpus, DEFAULTS.trainerGpus),
    shareGpus: resources.share_verifier_gpus === true,
    evaluate: evaluate !== null,
    evalPrompts: text(evaluate?.prompts, DEFAULTS.evalPrompts),
    evalMaxTokens: text(evaluate?.max_tokens, DEFAULTS.evalMaxTokens),
    evalBaseline: evaluate ? evaluate.baseline === true : DEFAULTS.evalBaseline,
    evalNgram: evaluate ? evaluate.ngram === true : DEFAULTS.evalNgram,
    gate: gate ? "custom" : "none",
    gateMinAL: text(gate?.min_acceptance_length, ""),
    gateMinSpeedup: text(gate?.min_speedup, ""),
    gateBeatNgram: gate?.beat_ngram === true,
    publish: job.publish ?? "",
  };
}

/**
 * Where an API error belongs: the field its param names (a list item's index dropped:
 * "speculator.target_layer_ids.0"), or the form as a whole.
 */
export function placeError(error: unknown): { fields: FieldErrors; form: string | null } {
  if (!error) return { fields: {}, form: null };
  if (error instanceof ApiError && error.param) {
    const param = error.param.replace(/(\.\d+)+$/, "");
    const field = PARAMS.includes(param) ? param : PARAMS.find((p) => param.startsWith(`${p}.`));
    if (field) return { fields: { [field]: error.message }, form: null };
  }
  return { fields: {}, form: messageOf(error) };
}

/** A fresh Idempotency-Key (crypto.randomUUID needs a secure context; fall back without one). */
export function newIdempotencyKey(): string {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** An argv as one shell-like line (arguments with spaces or quotes in single quotes). */
export function commandLine(argv: string[]): string {
  return argv.map((a) => (/^[\w@%+=:,./<>-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`)).join(" ");
}
