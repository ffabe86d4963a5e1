// The new-job form: its state, its client-side checks (the same limits as app/schemas/jobs.py
// JobCreate and SpeculatorSpec), and the one function that turns it into a JobCreate body.
import type { Job, JobCreate, Verifier } from "../../api/client";
import { ApiError, messageOf } from "../../api/errors";
import type { FieldErrors } from "../../components/form";
import { KINDS, isBlockKind, type Kind } from "../job/model";

export { KINDS, isBlockKind, type Kind };

export type Runtime = "" | "local" | "vllm"; // "": the server's default
export type Mode = JobCreate["mode"];
export type Scheduler = "cosine" | "linear" | "none";
export type GateChoice = "default" | "none" | "custom";

/**
 * A bake-off's candidate as the form holds it: its kind, a name, and the few settings that
 * commonly differ; an empty one takes the job's speculator setting (the API's rule: each
 * candidate takes the fields set in "speculator" that its kind has, unless it sets its own).
 * `extra`: settings a cloned job's candidate had apart from those, sent as they were.
 */
export interface CandidateForm {
  key: number; // a stable React key
  kind: Kind;
  name: string;
  blockSize: string; // block kinds only
  numLayers: string;
  epochs: string;
  lr: string;
  extra: Record<string, unknown>;
}

export interface JobForm {
  name: string; // optional
  dataset: string;
  verifier: string;
  kind: Kind;
  blockSize: string;
  tttSteps: string; // eagle3 only
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
  candidatesInParallel: boolean;
  evaluate: boolean;
  evalPrompts: string;
  evalMaxTokens: string;
  evalRounds: string;
  evalBaseline: boolean;
  evalNgram: boolean;
  gate: GateChoice;
  gateMinAL: string;
  gateMinSpeedup: string;
  gateBeatNgram: boolean;
  publish: string;
  candidates: CandidateForm[]; // empty: the job trains the speculator alone
}

/** The API's defaults (an empty dataset and verifier: they have none). */
export const DEFAULTS: JobForm = {
  name: "",
  dataset: "",
  verifier: "",
  kind: "dflash",
  blockSize: "16",
  tttSteps: "3",
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
  candidatesInParallel: false,
  evaluate: true,
  evalPrompts: "8",
  evalMaxTokens: "64",
  evalRounds: "3",
  evalBaseline: true,
  evalNgram: true,
  gate: "default",
  gateMinAL: "",
  gateMinSpeedup: "",
  gateBeatNgram: false,
  publish: "",
  candidates: [],
};

let nextKey = 1;

/** A new candidate row: its kind, and everything else taken from the speculator. */
export function newCandidate(kind: Kind = "dflash", fields: Partial<Omit<CandidateForm, "key" | "kind">> = {}): CandidateForm {
  return { key: nextKey++, kind, name: "", blockSize: "", numLayers: "", epochs: "", lr: "", extra: {}, ...fields };
}

/** A quick bake-off on the tiny demo verifier that `specdeck run` makes: three drafters the
 * CPU can serve (the local runtime serves dflash and eagle3), sharing the demo's settings. */
export function demoForm(): Partial<JobForm> {
  return {
    verifier: "demo",
    kind: "dflash",
    blockSize: "8",
    numLayers: "2",
    targetLayerIds: "",
    maxAnchors: "32",
    seqLen: "512",
    epochs: "2",
    lr: "0.003",
    runtime: "local",
    candidates: [
      newCandidate("dflash", { name: "dflash-b8", blockSize: "8", numLayers: "2" }),
      newCandidate("dflash", { name: "dflash-b4", blockSize: "4", numLayers: "1" }),
      newCandidate("eagle3", { name: "eagle3", numLayers: "1" }),
    ],
  };
}

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
  | "blockSize" | "tttSteps" | "numLayers" | "maxAnchors" | "seqLen" | "epochs" | "lr" | "seed"
  | "tensorParallel" | "dataParallel" | "trainerGpus" | "evalPrompts" | "evalMaxTokens" | "evalRounds"
  | "gateMinAL" | "gateMinSpeedup";

/** Every number input: the param the API names it by, its label, and its limits. */
export const NUMBERS: Record<NumberKey, NumberSpec> = {
  blockSize: { param: "speculator.block_size", label: "Block size", min: 2, max: 64, integer: true },
  tttSteps: { param: "speculator.ttt_steps", label: "TTT steps", min: 1, max: 16, integer: true },
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
  evalRounds: { param: "evaluate.rounds", label: "Rounds", min: 1, max: 20, integer: true },
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
  kind: "speculator.type",
  candidates: "candidates",
  targetLayerIds: "speculator.target_layer_ids",
  scheduler: "speculator.scheduler",
  mode: "mode",
  runtime: "runtime",
  shareGpus: "resources.share_verifier_gpus",
  candidatesInParallel: "resources.candidates_in_parallel",
  evaluate: "evaluate",
  evalBaseline: "evaluate.baseline",
  evalNgram: "evaluate.ngram",
  gate: "gate",
  gateBeatNgram: "gate.beat_ngram",
  publish: "publish",
} as const;

/** Every param the form has a field for, for placing API errors. */
export const PARAMS: string[] = [...Object.values(P), ...Object.values(NUMBERS).map((n) => n.param)];

/** A candidate row's fields: the param the API names each by (candidates.<i>.<field>), its
 * label and limits (those of the speculator's field of the same name). */
export const CANDIDATE_FIELDS = {
  kind: { field: "type", label: "Kind" },
  name: { field: "name", label: "Name" },
  blockSize: { field: "block_size", label: "Block size", spec: NUMBERS.blockSize },
  numLayers: { field: "num_layers", label: "Layers", spec: NUMBERS.numLayers },
  epochs: { field: "epochs", label: "Epochs", spec: NUMBERS.epochs },
  lr: { field: "lr", label: "Learning rate", spec: NUMBERS.lr },
} as const;
export type CandidateKey = keyof typeof CANDIDATE_FIELDS;

export const candidateParam = (index: number, key: CandidateKey) => `candidates.${index}.${CANDIDATE_FIELDS[key].field}`;

// app/schemas/jobs.py CANDIDATE_NAME
const CANDIDATE_NAME = /^[a-z0-9][a-z0-9_.-]{0,39}$/;

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
    if (key === "blockSize" || key === "maxAnchors") return isBlockKind(form.kind);
    if (key === "tttSteps") return form.kind === "eagle3";
    if (key === "evalRounds") return form.evaluate;
    return true;
  });
}

/** The client-side problems, by param. `verifier`: what the preview learnt of it, if anything. */
export function validate(form: JobForm, verifier?: Verifier): FieldErrors {
  const errors: FieldErrors = validateCandidates(form);
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

/** The candidate rows' problems: their numbers (empty: the speculator's) and names. */
function validateCandidates(form: JobForm): FieldErrors {
  const errors: FieldErrors = {};
  const seen = new Set<string>();
  form.candidates.forEach((c, i) => {
    for (const key of ["blockSize", "numLayers", "epochs", "lr"] as const) {
      if (key === "blockSize" && !isBlockKind(c.kind)) continue;
      const value = parseNumber(c[key], { ...CANDIDATE_FIELDS[key].spec, optional: true });
      if (typeof value === "string") errors[candidateParam(i, key)] = value;
    }
    const name = c.name.trim();
    if (name && !CANDIDATE_NAME.test(name))
      errors[candidateParam(i, "name")] = "Lower-case letters, digits, “-”, “_” or “.”, at most 40, starting with a letter or digit";
    else if (name && seen.has(name)) errors[candidateParam(i, "name")] = "Another candidate has this name";
    if (name) seen.add(name);
  });
  return errors;
}

function num(form: JobForm, key: NumberKey): number {
  return Number(form[key].trim());
}

function optionalNum(form: JobForm, key: NumberKey): number | null {
  return form[key].trim() === "" ? null : num(form, key);
}

type Speculator = NonNullable<JobCreate["speculator"]>;
type CandidateBody = NonNullable<JobCreate["candidates"]>[number];

/** The job's drafter (a bake-off's shared settings): its kind's fields only. */
function speculatorOf(form: JobForm, ids: number[] | null): Speculator {
  const common = {
    num_layers: num(form, "numLayers"),
    target_layer_ids: ids,
    total_seq_len: num(form, "seqLen"),
    epochs: num(form, "epochs"),
    lr: num(form, "lr"),
    scheduler: form.scheduler,
    seed: num(form, "seed"),
  };
  if (form.kind === "eagle3") return { type: "eagle3", ...common, ttt_steps: num(form, "tttSteps") };
  return { type: form.kind, ...common, block_size: num(form, "blockSize"), max_anchors: num(form, "maxAnchors") };
}

/** A candidate: its kind, and only what its row sets (the rest comes from the speculator). */
function candidateBody(c: CandidateForm): CandidateBody {
  const body: Record<string, unknown> = { ...c.extra, type: c.kind };
  if (c.name.trim()) body.name = c.name.trim();
  if (isBlockKind(c.kind) && c.blockSize.trim()) body.block_size = Number(c.blockSize.trim());
  if (c.numLayers.trim()) body.num_layers = Number(c.numLayers.trim());
  if (c.epochs.trim()) body.epochs = Number(c.epochs.trim());
  if (c.lr.trim()) body.lr = Number(c.lr.trim());
  // The generated type lists every field as required (they have defaults); the API takes any subset.
  return body as CandidateBody;
}

/** The POST /api/jobs body for a form that `validate` passes. */
export function buildBody(form: JobForm): JobCreate {
  const ids = parseLayerIds(form.targetLayerIds, undefined);
  const body: JobCreate = {
    dataset: form.dataset,
    verifier: form.verifier.trim(),
    speculator: speculatorOf(form, Array.isArray(ids) ? ids : null),
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
            candidates_in_parallel: form.candidates.length > 0 && form.candidatesInParallel,
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
          rounds: num(form, "evalRounds"),
        }
      : false,
  };
  if (form.candidates.length > 0) body.candidates = form.candidates.map(candidateBody);
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
  const resources = job.resources as {
    verifier?: Record<string, unknown>;
    trainer_gpus?: unknown;
    share_verifier_gpus?: unknown;
    candidates_in_parallel?: unknown;
  };
  const evaluate = job.evaluate === false ? null : (job.evaluate as Record<string, unknown>);
  const gate = job.gate as Record<string, unknown> | null;
  const ids = spec.target_layer_ids;
  return {
    name: job.name ? `${job.name} (clone)`.slice(0, NAME_MAX) : "",
    dataset: job.dataset,
    verifier: job.verifier,
    kind: kindOf(spec.type),
    blockSize: text(spec.block_size, DEFAULTS.blockSize),
    tttSteps: text(spec.ttt_steps, DEFAULTS.tttSteps),
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
    candidatesInParallel: resources.candidates_in_parallel === true,
    evaluate: evaluate !== null,
    evalPrompts: text(evaluate?.prompts, DEFAULTS.evalPrompts),
    evalMaxTokens: text(evaluate?.max_tokens, DEFAULTS.evalMaxTokens),
    evalRounds: text(evaluate?.rounds, DEFAULTS.evalRounds),
    evalBaseline: evaluate ? evaluate.baseline === true : DEFAULTS.evalBaseline,
    evalNgram: evaluate ? evaluate.ngram === true : DEFAULTS.evalNgram,
    gate: gate ? "custom" : "none",
    gateMinAL: text(gate?.min_acceptance_length, ""),
    gateMinSpeedup: text(gate?.min_speedup, ""),
    gateBeatNgram: gate?.beat_ngram === true,
    publish: job.publish ?? "",
    candidates: job.candidates.length > 1 || job.candidates.some((c) => c.name !== c.kind) ? job.candidates.map((c) => candidateOf(c, spec)) : [],
  };
}

const kindOf = (value: unknown): Kind => KINDS.find((k) => k.kind === value)?.kind ?? "dflash";

// What a candidate row has a field for (and total_seq_len, which every candidate shares).
const ROW_FIELDS = new Set(["type", "name", "block_size", "num_layers", "epochs", "lr", "total_seq_len"]);

/** A cloned job's candidate as a row: each setting it shares with the speculator left empty
 * (it follows the speculator's field), the others set; its settings that the row has no
 * field for are kept in `extra` and sent as they were. */
function candidateOf(c: Job["candidates"][number], spec: Record<string, unknown>): CandidateForm {
  const own = (key: string) => {
    const value = c.settings[key];
    return value == null || same(value, spec[key]) ? "" : text(value, "");
  };
  const extra = Object.fromEntries(
    Object.entries(c.settings).filter(([key, value]) => !ROW_FIELDS.has(key) && value != null && !same(value, spec[key])),
  );
  return newCandidate(kindOf(c.kind), {
    name: c.name,
    blockSize: isBlockKind(c.kind) ? own("block_size") : "",
    numLayers: own("num_layers"),
    epochs: own("epochs"),
    lr: own("lr"),
    extra,
  });
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/**
 * Where an API error belongs: the field its param names (a list item's index dropped:
 * "speculator.target_layer_ids.0"), or the form as a whole.
 */
export function placeError(error: unknown): { fields: FieldErrors; form: string | null } {
  if (!error) return { fields: {}, form: null };
  if (error instanceof ApiError && error.param) {
    // A candidate's field (candidates.1.type), or the candidate as a whole (candidates.1.max_anchors,
    // a field its row does not show): its row.
    const row = /^candidates\.(\d+)(?:\.([a-z_]+))?/.exec(error.param);
    if (row) {
      const key = (Object.keys(CANDIDATE_FIELDS) as CandidateKey[]).find((k) => CANDIDATE_FIELDS[k].field === row[2]);
      return { fields: { [key ? candidateParam(Number(row[1]), key) : `candidates.${row[1]}`]: error.message }, form: null };
    }
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
