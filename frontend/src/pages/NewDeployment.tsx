import { useState, type FormEvent } from "react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { Link, useNavigate, useSearchParams } from "react-router-dom";
import { hasFreeServingSlot, useWorkers } from "../api/stack";
import { api, must, type CaptureOptions } from "../api/client";
import { ApiError, messageOf } from "../api/errors";
import { Field, FormError, described, useFieldErrors } from "../components/form";
import { RelTime } from "../components/time";
import { CaptureFields } from "./deployment/CaptureFields";
import { epochOf } from "./job/model";
import { VerdictNote } from "./job/Verdict";
import {
  CAPTURE_DEFAULTS,
  CAPTURE_FIELDS,
  captureBody,
  validateCapture,
  type CaptureForm,
} from "./deployment/captureOptions";
import "./deploy/deploy.css";

// The limits of app/schemas/deployments.py DeploymentCreate (and DeploymentResources).
const NAME_MAX = 100;
const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:/-]*$/;
const CHECKPOINT_PATTERN = /^ckpt_[0-9a-f]{24}$/;
const REF_MAX = 512;
const SPEC_MIN = 1;
const SPEC_MAX = 64;
const TP_MIN = 1;
const TP_MAX = 64;
const REPLICAS_MIN = 1;
const REPLICAS_MAX = 16; // app/schemas/deployments.py MAX_REPLICAS

const FIELDS = [
  "name",
  "checkpoint_id",
  "drafter",
  "verifier",
  "num_speculative_tokens",
  "runtime",
  "tensor_parallel_size",
  "replicas",
  "confirm_verdict",
  ...CAPTURE_FIELDS,
];

type SourceKind = "checkpoint" | "hub";
type Runtime = "" | "local" | "vllm";
// DeploymentCreate, one source or the other (openapi-fetch wants the unused one left out).
type Body = {
  name: string;
  num_speculative_tokens: number | null;
  runtime: "local" | "vllm" | null;
  resources: { tensor_parallel_size: number };
  replicas: number;
  capture: CaptureOptions | null;
} & ({ checkpoint_id: string } | { drafter: string; verifier: string });

/** A default served name: "drafter-" and the tail of the checkpoint id, or of the time. */
function defaultName(checkpoint: string): string {
  if (CHECKPOINT_PATTERN.test(checkpoint)) return `drafter-${checkpoint.slice(-6)}`;
  return `drafter-${Math.floor(Date.now() / 1000).toString(36)}`;
}

function intIn(text: string, min: number, max: number): boolean {
  if (!/^\d+$/.test(text.trim())) return false;
  const n = Number(text);
  return n >= min && n <= max;
}

function useCheckpoint(id: string | null) {
  return useQuery({
    queryKey: ["checkpoint", id],
    queryFn: () => must(api.GET("/api/checkpoints/{checkpoint_id}", { params: { path: { checkpoint_id: id! } } })),
    retry: (count, error) => !(error instanceof ApiError && error.status < 500) && count < 2,
    enabled: id != null,
  });
}

/** The checkpoint a valid id names: its job (a bake-off's candidate), drafter kind, epoch and
 * served acceptance length. */
function CheckpointPreview({ id }: { id: string }) {
  const checkpoint = useCheckpoint(id);
  const jobId = checkpoint.data?.job_id;
  const job = useQuery({
    queryKey: ["job", jobId ?? ""],
    queryFn: () => must(api.GET("/api/jobs/{job_id}", { params: { path: { job_id: jobId! } } })),
    enabled: jobId !== undefined,
  });
  if (checkpoint.isPending)
    return (
      <p className="hint" role="status">
        <span className="spinner" aria-hidden="true" /> Looking up the checkpoint…
      </p>
    );
  if (checkpoint.error)
    return (
      <p className="field-error" role="alert">
        {checkpoint.error instanceof ApiError && checkpoint.error.status === 404
          ? "No such checkpoint in this project."
          : messageOf(checkpoint.error)}
      </p>
    );
  const c = checkpoint.data;
  return (
    <dl className="kv deploy-ckpt" aria-label="Checkpoint">
      <dt>Job</dt>
      <dd>
        <Link to={`/jobs/${c.job_id}`} className="mono">
          {c.job_id}
        </Link>
      </dd>
      {job.data && job.data.candidates.length > 1 && (
        <>
          <dt>Candidate</dt>
          <dd data-testid="deploy-candidate">
            {job.data.candidates.find((x) => x.index === c.candidate)?.name ?? `#${c.candidate + 1}`}
            {job.data.winner != null &&
              (job.data.winner === job.data.candidates.find((x) => x.index === c.candidate)?.name ? (
                <span className="badge good deploy-best">winner</span>
              ) : (
                <span className="dim"> (not the winner: {job.data.winner} is)</span>
              ))}
          </dd>
        </>
      )}
      <dt>Kind</dt>
      <dd>{c.kind}</dd>
      <dt>Epoch</dt>
      <dd>
        {epochOf(c.epoch)}
        {c.is_best && <span className="badge good deploy-best">best</span>}
      </dd>
      <dt>Served speedup</dt>
      <dd data-testid="deploy-speedup">{speedupOf(c.evaluation)}</dd>
      <dt>Served AL</dt>
      <dd>{c.served_acceptance_length != null ? c.served_acceptance_length.toFixed(2) : "not measured"}</dd>
      <dt>Saved</dt>
      <dd>
        <RelTime at={c.created_at} />
      </dd>
    </dl>
  );
}

/** "×2.31 ±0.05": the output tokens/s of the verifier alone it served at, in its evaluation. */
function speedupOf(evaluation: Record<string, unknown> | null | undefined): string {
  const speedup = evaluation?.speedup;
  if (typeof speedup !== "number") return "not measured";
  const spread = evaluation?.speedup_spread;
  return `×${speedup.toFixed(2)}${typeof spread === "number" ? ` ±${spread.toFixed(2)}` : ""}`;
}

/** Said before anything is created: no live worker could start its engine now. */
function NoFreeSlot({ runtime }: { runtime: Runtime }) {
  const workers = useWorkers();
  if (!workers.data) return null;
  const live = workers.data.data;
  const runtimes: ("local" | "vllm")[] = runtime ? [runtime] : ["local", "vllm"];
  if (runtimes.some((r) => hasFreeServingSlot(live, r))) return null;
  return (
    <p className="state warn" role="status" data-testid="no-free-slot">
      {live.some((w) => w.alive)
        ? `No worker has a free serving slot${runtime ? ` for the ${runtime} runtime` : ""} now: every one is held by a
          deployment or a job.`
        : "No worker is running now."}{" "}
      The deployment will wait, pending, until one frees up (see <Link to="/workers">Workers</Link>); scale another
      deployment down or start a worker to serve it sooner.
    </p>
  );
}

export default function NewDeployment() {
  const [search] = useSearchParams();
  const prefilled = search.get("checkpoint") ?? "";
  const [name, setName] = useState(() => defaultName(prefilled));
  const [kind, setKind] = useState<SourceKind>(prefilled || !search.get("drafter") ? "checkpoint" : "hub");
  const [checkpointId, setCheckpointId] = useState(prefilled);
  const [drafter, setDrafter] = useState(search.get("drafter") ?? "");
  const [verifier, setVerifier] = useState(search.get("verifier") ?? "");
  const [specTokens, setSpecTokens] = useState("");
  const [runtime, setRuntime] = useState<Runtime>("");
  const [tp, setTp] = useState("1");
  const [replicas, setReplicas] = useState("1");
  const [capture, setCapture] = useState<CaptureForm>(CAPTURE_DEFAULTS);
  // A checkpoint whose evaluation says it does not pay off is deployed only once confirmed.
  const [confirmed, setConfirmed] = useState(false);
  const { errors, setErrors, formError, fromError, clear } = useFieldErrors(FIELDS);
  const navigate = useNavigate();
  const queryClient = useQueryClient();

  const create = useMutation({
    mutationFn: (body: Body) => must(api.POST("/api/deployments", { body })),
    onSuccess: (deployment) => {
      queryClient.invalidateQueries({ queryKey: ["deployments"] });
      queryClient.setQueryData(["deployment", deployment.id], deployment);
      navigate(`/deployments/${deployment.id}`);
    },
    onError: fromError,
  });

  const checkpointValid = CHECKPOINT_PATTERN.test(checkpointId.trim());
  const chosen = useCheckpoint(kind === "checkpoint" && checkpointValid ? checkpointId.trim() : null);
  const verdict = kind === "checkpoint" && checkpointValid ? (chosen.data?.verdict ?? null) : null;

  function validate(): Record<string, string> {
    const e: Record<string, string> = {};
    const n = name.trim();
    if (!n) e.name = "Give the deployment a name";
    else if (n.length > NAME_MAX) e.name = `At most ${NAME_MAX} characters`;
    else if (!NAME_PATTERN.test(n))
      e.name = "Start with a letter or digit; then letters, digits and . _ : / - only";
    if (kind === "checkpoint") {
      if (!CHECKPOINT_PATTERN.test(checkpointId.trim()))
        e.checkpoint_id = "A checkpoint id looks like ckpt_ followed by 24 hex digits";
    } else {
      if (!drafter.trim()) e.drafter = "Give a Hub id or a path under the models root";
      else if (drafter.trim().length > REF_MAX) e.drafter = `At most ${REF_MAX} characters`;
      if (!verifier.trim()) e.verifier = "A drafter needs its verifier";
      else if (verifier.trim().length > REF_MAX) e.verifier = `At most ${REF_MAX} characters`;
    }
    if (specTokens.trim() && !intIn(specTokens, SPEC_MIN, SPEC_MAX))
      e.num_speculative_tokens = `A whole number from ${SPEC_MIN} to ${SPEC_MAX}, or empty`;
    if (!intIn(tp, TP_MIN, TP_MAX)) e.tensor_parallel_size = `A whole number from ${TP_MIN} to ${TP_MAX}`;
    if (!intIn(replicas, REPLICAS_MIN, REPLICAS_MAX))
      e.replicas = `A whole number from ${REPLICAS_MIN} to ${REPLICAS_MAX}`;
    if (verdict && !confirmed) e.confirm_verdict = "Tick this to deploy a drafter that does not pay off";
    return { ...e, ...validateCapture(capture) };
  }

  function submit(event: FormEvent) {
    event.preventDefault();
    clear();
    const problems = validate();
    if (Object.keys(problems).length) {
      setErrors(problems);
      const first = FIELDS.find((f) => problems[f]);
      document.getElementById(`dep-${first}`)?.focus();
      return;
    }
    const common = {
      name: name.trim(),
      num_speculative_tokens: specTokens.trim() ? Number(specTokens) : null,
      runtime: runtime || null,
      resources: { tensor_parallel_size: Number(tp) },
      replicas: Number(replicas),
      capture: captureBody(capture),
    };
    create.mutate(
      kind === "checkpoint"
        ? { ...common, checkpoint_id: checkpointId.trim() }
        : { ...common, drafter: drafter.trim(), verifier: verifier.trim() },
    );
  }


  return (
    <>
      <p className="deploy-crumbs">
        <Link to="/deployments">← Deployments</Link>
      </p>
      <h1>New deployment</h1>
      <form onSubmit={submit} className="card deploy-form" aria-label="New deployment" noValidate>
        <Field
          id="dep-name"
          label="Name"
          error={errors.name}
          hint="The model name clients send to /v1/chat/completions."
        >
          <input
            {...described("dep-name", errors.name, true)}
            value={name}
            maxLength={NAME_MAX}
            autoComplete="off"
            spellCheck={false}
            required
            onChange={(e) => setName(e.target.value)}
          />
        </Field>

        <fieldset>
          <legend>Source</legend>
          <div className="deploy-radios">
            <label className="check">
              <input
                type="radio"
                name="source"
                value="checkpoint"
                checked={kind === "checkpoint"}
                onChange={() => setKind("checkpoint")}
              />
              From a checkpoint
            </label>
            <label className="check">
              <input type="radio" name="source" value="hub" checked={kind === "hub"} onChange={() => setKind("hub")} />
              From a Hub drafter
            </label>
          </div>
          {kind === "checkpoint" ? (
            <>
              <Field
                id="dep-checkpoint_id"
                label="Checkpoint id"
                error={errors.checkpoint_id}
                hint="A checkpoint of one of your jobs; it is served with the verifier it was trained for."
              >
                <input
                  {...described("dep-checkpoint_id", errors.checkpoint_id, true)}
                  className="mono"
                  value={checkpointId}
                  placeholder="ckpt_…"
                  autoComplete="off"
                  spellCheck={false}
                  onChange={(e) => {
                    setCheckpointId(e.target.value);
                    setConfirmed(false);
                  }}
                />
              </Field>
              {checkpointValid && <CheckpointPreview id={checkpointId.trim()} />}
              {verdict && (
                <>
                  <VerdictNote verdict={verdict} />
                  <label className="check">
                    <input
                      type="checkbox"
                      {...described("dep-confirm_verdict", errors.confirm_verdict)}
                      checked={confirmed}
                      onChange={(e) => {
                        setConfirmed(e.target.checked);
                        if (e.target.checked) setErrors(({ confirm_verdict: _, ...rest }) => rest);
                      }}
                    />
                    Deploy it anyway ({verdict.summary})
                  </label>
                  {errors.confirm_verdict && (
                    <div className="field-error" id="dep-confirm_verdict-error" role="alert">
                      {errors.confirm_verdict}
                    </div>
                  )}
                </>
              )}
            </>
          ) : (
            <div className="grid2">
              <Field
                id="dep-drafter"
                label="Drafter"
                error={errors.drafter}
                hint="A Hub repo id (org/name) or a path under the models root."
              >
                <input
                  {...described("dep-drafter", errors.drafter, true)}
                  value={drafter}
                  maxLength={REF_MAX}
                  autoComplete="off"
                  spellCheck={false}
                  onChange={(e) => setDrafter(e.target.value)}
                />
              </Field>
              <Field id="dep-verifier" label="Verifier" error={errors.verifier} hint="The model the drafter was trained for.">
                <input
                  {...described("dep-verifier", errors.verifier, true)}
                  value={verifier}
                  maxLength={REF_MAX}
                  autoComplete="off"
                  spellCheck={false}
                  onChange={(e) => setVerifier(e.target.value)}
                />
              </Field>
            </div>
          )}
        </fieldset>

        <fieldset>
          <legend>Serving</legend>
          <div className="grid3 deploy-serving">
            <Field
              id="dep-num_speculative_tokens"
              label="Speculative tokens"
              error={errors.num_speculative_tokens}
              hint={`${SPEC_MIN}–${SPEC_MAX}; empty: the drafter's block size − 1.`}
            >
              <input
                {...described("dep-num_speculative_tokens", errors.num_speculative_tokens, true)}
                type="number"
                inputMode="numeric"
                min={SPEC_MIN}
                max={SPEC_MAX}
                step={1}
                value={specTokens}
                onChange={(e) => setSpecTokens(e.target.value)}
              />
            </Field>
            <Field id="dep-runtime" label="Runtime" error={errors.runtime} hint="Where it is served.">
              <select
                {...described("dep-runtime", errors.runtime, true)}
                value={runtime}
                onChange={(e) => setRuntime(e.target.value as Runtime)}
              >
                <option value="">Server default</option>
                <option value="local">local</option>
                <option value="vllm">vllm</option>
              </select>
            </Field>
            <Field
              id="dep-tensor_parallel_size"
              label="Tensor parallel size"
              error={errors.tensor_parallel_size}
              hint={`GPUs for the verifier, ${TP_MIN}–${TP_MAX}.`}
            >
              <input
                {...described("dep-tensor_parallel_size", errors.tensor_parallel_size, true)}
                type="number"
                inputMode="numeric"
                min={TP_MIN}
                max={TP_MAX}
                step={1}
                value={tp}
                onChange={(e) => setTp(e.target.value)}
              />
            </Field>
            <Field
              id="dep-replicas"
              label="Replicas"
              error={errors.replicas}
              hint="Engines serving it, each on a worker slot of its own; the gateway balances over them."
            >
              <input
                {...described("dep-replicas", errors.replicas, true)}
                type="number"
                inputMode="numeric"
                min={REPLICAS_MIN}
                max={REPLICAS_MAX}
                step={1}
                value={replicas}
                onChange={(e) => setReplicas(e.target.value)}
              />
            </Field>
          </div>
        </fieldset>

        <CaptureFields value={capture} onChange={setCapture} errors={errors} />

        <NoFreeSlot runtime={runtime} />

        <FormError message={formError} />
        <div className="actions">
          <button type="submit" className="primary" disabled={create.isPending}>
            {create.isPending ? "Creating…" : "Create deployment"}
          </button>
          <Link to="/deployments">Cancel</Link>
        </div>
      </form>
    </>
  );
}
