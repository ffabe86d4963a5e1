import { useEffect, useRef, useState, type FormEvent, type ReactNode } from "react";
import { Link, useNavigate, useSearchParams } from "react-router-dom";
import { keepPreviousData, useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type Dataset, type JobCreate } from "../api/client";
import { messageOf } from "../api/errors";
import { Field, FormError, described } from "../components/form";
import { UploadDataset } from "./Datasets";
import { CandidateRows, kindOption } from "./jobs/Candidates";
import {
  DEFAULTS,
  KINDS,
  NUMBERS,
  P,
  buildBody,
  demoForm,
  fieldId,
  isBlockKind,
  formOf,
  newIdempotencyKey,
  placeError,
  validate,
  type CandidateForm,
  type GateChoice,
  type JobForm,
  type Kind,
  type Mode,
  type Runtime,
  type Scheduler,
} from "./jobs/form";
import { PlanPreview, VerifierPreview, useDebounced } from "./jobs/previews";
import { offersGpus, useLocalVerifiers, useWorkers } from "../api/stack";
import "./jobs/jobs.css";

type NumberKey = keyof typeof NUMBERS;

const PARAM_OF: Partial<Record<keyof JobForm, string>> = {
  ...P,
  ...Object.fromEntries(Object.entries(NUMBERS).map(([key, spec]) => [key, spec.param])),
};

export default function NewJob() {
  const navigate = useNavigate();
  const queryClient = useQueryClient();
  const [form, setForm] = useState<JobForm>(DEFAULTS);
  const [touched, setTouched] = useState<ReadonlySet<string>>(new Set());
  const [submitted, setSubmitted] = useState(false);
  // One Idempotency-Key per body: a retry or a double click sends the same one.
  const idempotency = useRef<{ body: string; key: string } | null>(null);

  // /jobs/new?clone=job_…: the form starts as a copy of that job's settings.
  const cloneOf = useSearchParams()[0].get("clone");
  const cloned = useQuery({
    queryKey: ["clone", cloneOf],
    queryFn: () => must(api.GET("/api/jobs/{job_id}", { params: { path: { job_id: cloneOf! } } })),
    enabled: cloneOf !== null,
    retry: false,
    staleTime: Infinity, // the settings are copied once; a job's settings never change
  });
  const clonedJob = cloned.data;
  const copied = useRef<string | null>(null);
  useEffect(() => {
    if (!clonedJob || copied.current === clonedJob.id) return;
    copied.current = clonedJob.id;
    setForm(formOf(clonedJob));
  }, [clonedJob]);

  const datasets = useQuery({
    queryKey: ["datasets", "all"],
    queryFn: () => must(api.GET("/api/datasets", { params: { query: { limit: 100 } } })),
  });

  const verifierRef = form.verifier.trim();
  const inspected = useDebounced(verifierRef, 400);
  const inspect = useQuery({
    queryKey: ["verifier-inspect", inspected],
    queryFn: ({ signal }) => must(api.POST("/api/verifiers/inspect", { body: { verifier: inspected }, signal })),
    enabled: inspected !== "" && inspected.length <= 512,
    retry: false,
    staleTime: 60_000,
  });
  const inspectCurrent = inspected === verifierRef && verifierRef !== "";
  const verifier = inspectCurrent ? inspect.data : undefined;

  const clientErrors = validate(form, verifier);
  const valid = Object.keys(clientErrors).length === 0;
  const bodyJson = valid ? JSON.stringify(buildBody(form)) : null;
  const planned = useDebounced(bodyJson, 400);
  const plan = useQuery({
    queryKey: ["job-plan", planned],
    queryFn: ({ signal }) => must(api.POST("/api/jobs/plan", { body: JSON.parse(planned!) as JobCreate, signal })),
    enabled: planned !== null && planned === bodyJson,
    retry: false,
    staleTime: 30_000,
    placeholderData: keepPreviousData,
  });
  const planCurrent = planned === bodyJson && bodyJson !== null;

  const create = useMutation({
    mutationFn: ({ body, key }: { body: JobCreate; key: string }) =>
      must(api.POST("/api/jobs", { body, params: { header: { "idempotency-key": key } } })),
    onSuccess: (job) => {
      queryClient.invalidateQueries({ queryKey: ["jobs"] });
      navigate(`/jobs/${job.id}`);
    },
  });

  // Where each problem is shown: the client's own checks first, then the API's answers.
  const submitErrors = placeError(create.error);
  const planErrors = planCurrent && plan.isError ? placeError(plan.error) : placeError(null);
  const inspectError = inspectCurrent && inspect.isError ? messageOf(inspect.error) : undefined;
  function errorOf(param: string): string | undefined {
    const client = submitted || touched.has(param) ? clientErrors[param] : undefined;
    return client ?? submitErrors.fields[param] ?? planErrors.fields[param] ?? (param === P.verifier ? inspectError : undefined);
  }

  function update<K extends keyof JobForm>(key: K, value: JobForm[K]) {
    setForm((f) => ({ ...f, [key]: value }));
    const param = PARAM_OF[key];
    if (param) setTouched((t) => (t.has(param) ? t : new Set(t).add(param)));
    if (create.isError) create.reset();
  }

  function updateCandidates(candidates: CandidateForm[]) {
    setForm((f) => ({ ...f, candidates }));
    if (create.isError) create.reset();
  }

  function applyDemo() {
    setForm((f) => ({
      ...f,
      ...demoForm(),
      // The demo dataset that `specdeck run` uploads, unless one is chosen already.
      dataset: f.dataset || datasets.data?.data.find((d) => d.name === "demo")?.id || "",
    }));
    if (create.isError) create.reset();
  }

  // On a stack whose workers offer no GPU and that has `specdeck run`'s demo verifier, a new
  // form opens with the demo settings (the API's defaults would train for hours on a CPU).
  const workers = useWorkers();
  const models = useLocalVerifiers();
  const gpus = workers.data ? offersGpus(workers.data.data) : false;
  const cpuDemo = workers.isSuccess && !gpus && models.data?.data.some((m) => m.verifier === "demo");
  const opened = useRef(false);
  useEffect(() => {
    if (opened.current || !cpuDemo || !datasets.isSuccess || cloneOf !== null || touched.size > 0) return;
    opened.current = true;
    applyDemo();
  });

  function submit(event: FormEvent) {
    event.preventDefault();
    if (create.isPending) return;
    setSubmitted(true);
    if (!valid) {
      document.getElementById(fieldId(Object.keys(clientErrors)[0]))?.focus();
      return;
    }
    const body = buildBody(form);
    const json = JSON.stringify(body);
    if (idempotency.current?.body !== json) idempotency.current = { body: json, key: newIdempotencyKey() };
    create.mutate({ body, key: idempotency.current.key });
  }

  function numberField(key: NumberKey, hint?: ReactNode) {
    const spec = NUMBERS[key];
    const id = fieldId(spec.param);
    const error = errorOf(spec.param);
    return (
      <Field id={id} label={spec.label} error={error} hint={hint}>
        <input
          {...described(id, error, Boolean(hint))}
          type="number"
          inputMode={spec.integer ? "numeric" : "decimal"}
          min={spec.minExclusive ? undefined : spec.min}
          max={spec.max}
          step={spec.integer ? 1 : "any"}
          required={!spec.optional}
          value={form[key]}
          onChange={(e) => update(key, e.target.value)}
        />
      </Field>
    );
  }

  function checkField(
    key: "shareGpus" | "candidatesInParallel" | "gateBeatNgram" | "evalBaseline" | "evalNgram",
    param: string,
    label: string,
  ) {
    return (
      <label className="check">
        <input
          type="checkbox"
          id={fieldId(param)}
          checked={form[key]}
          onChange={(e) => update(key, e.target.checked)}
        />
        {label}
      </label>
    );
  }

  function selectField<K extends "kind" | "scheduler" | "mode" | "runtime" | "gate">(
    key: K,
    label: string,
    options: [JobForm[K], string][],
    hint?: ReactNode,
  ) {
    const param = PARAM_OF[key]!;
    const id = fieldId(param);
    const error = errorOf(param);
    return (
      <Field id={id} label={label} error={error} hint={hint}>
        <select
          {...described(id, error, Boolean(hint))}
          value={form[key]}
          onChange={(e) => update(key, e.target.value as JobForm[K])}
        >
          {options.map(([value, text]) => (
            <option key={value} value={value}>
              {text}
            </option>
          ))}
        </select>
      </Field>
    );
  }

  const datasetId = fieldId(P.dataset);
  const datasetError = errorOf(P.dataset) ?? (datasets.isError ? messageOf(datasets.error) : undefined);
  const chosen: Dataset | undefined = datasets.data?.data.find((d) => d.id === form.dataset);
  const verifierId = fieldId(P.verifier);
  const verifierError = errorOf(P.verifier);
  const nameId = fieldId(P.name);
  const nameError = errorOf(P.name);
  const layersId = fieldId(P.targetLayerIds);
  const layersError = errorOf(P.targetLayerIds);
  const defaultLayers = verifier?.default_target_layer_ids?.join(", ");
  const evaluateError = errorOf(P.evaluate);
  const publishId = fieldId(P.publish);
  const publishError = errorOf(P.publish);

  const planState = !planCurrent && bodyJson === null
    ? "incomplete"
    : planCurrent && plan.isError
      ? "error"
      : planCurrent && plan.isSuccess && !plan.isPlaceholderData
        ? "ready"
        : "loading";

  return (
    <>
      <div className="toolbar">
        <h1 className="jobs-title">New job</h1>
        <span className="spacer" />
        <button type="button" onClick={applyDemo}>
          Use demo settings
        </button>
      </div>
      <p className="hint newjob-lead">
        Train a drafter for a verifier on a dataset of chats, or a bake-off of several kinds and settings served side by
        side. The defaults are the API's; “Use demo settings” fills a small bake-off of three drafters on the tiny demo
        verifier that a CPU can train and serve.
      </p>
      {cpuDemo && cloneOf === null && (
        <p className="state" role="status" data-testid="cpu-defaults">
          No worker offers a GPU, so the form opened with the demo settings: minutes on a CPU, where the API's defaults (20
          epochs of 8,192-token sequences) would take hours.
        </p>
      )}
      {cloneOf && (
        <div className={`state${cloned.isError ? " error" : ""}`} role={cloned.isError ? "alert" : "status"} data-testid="clone-note">
          {cloned.isError ? (
            <>Job {cloneOf} could not be cloned: {messageOf(cloned.error)}</>
          ) : clonedJob ? (
            <>
              A copy of the settings of job <Link to={`/jobs/${clonedJob.id}`}>{clonedJob.name ?? clonedJob.id}</Link>: change
              what you like and create it.{clonedJob.init_from && " Its warm start is not carried over."}
            </>
          ) : (
            <>Loading the settings of job {cloneOf}…</>
          )}
        </div>
      )}

      {/* Outside the job's <form>: the inline upload is a form of its own. */}
      <fieldset className="card">
        <legend>Dataset</legend>
        <div className="grid2">
          <div>
            <Field
              id={datasetId}
              label="Dataset"
              error={datasetError}
              hint={
                chosen ? (
                  `${chosen.num_conversations ?? "?"} chats, ${chosen.kind === "public" ? `public preset ${chosen.public_name}` : chosen.format}`
                ) : datasets.data?.data.length === 0 ? (
                  "No datasets yet: upload a JSONL file here."
                ) : (
                  <>
                    Or manage them under <Link to="/datasets">Datasets</Link>.
                  </>
                )
              }
            >
              <select
                {...described(datasetId, datasetError, true)}
                form="new-job"
                value={form.dataset}
                disabled={datasets.isPending}
                onChange={(e) => update("dataset", e.target.value)}
              >
                <option value="">{datasets.isPending ? "Loading datasets…" : "Choose a dataset"}</option>
                {form.dataset && datasets.data && !chosen && (
                  // A cloned job's dataset that is not among the newest 100, or a path under the data root.
                  <option value={form.dataset}>{form.dataset}</option>
                )}
                {datasets.data?.data.map((d) => (
                  <option key={d.id} value={d.id}>
                    {d.name} ({d.id})
                  </option>
                ))}
              </select>
            </Field>
            {datasets.data?.has_more && (
              <p className="hint">Showing the newest 100 datasets.</p>
            )}
          </div>
          <UploadDataset onUploaded={(d) => update("dataset", d.id)} />
        </div>
      </fieldset>

      <form id="new-job" onSubmit={submit} noValidate aria-label="New job">
        <div className="newjob-cols">
          <div>
            <fieldset className="card">
              <legend>Verifier</legend>
              <Field
                id={nameId}
                label="Name"
                error={nameError}
                hint="Optional: tells this job apart in the list (“chat v2, regenerated”)."
              >
                <input
                  {...described(nameId, nameError, true)}
                  value={form.name}
                  maxLength={100}
                  autoComplete="off"
                  onChange={(e) => update("name", e.target.value)}
                />
              </Field>
              <Field
                id={verifierId}
                label="Verifier"
                error={verifierError}
                hint={
                  models.data?.data.length
                    ? `A Hugging Face Hub id (org/name) or a directory under the models root: ${models.data.data
                        .map((m) => m.verifier)
                        .join(", ")}.`
                    : "A Hugging Face Hub id (org/name) or a directory under the models root."
                }
              >
                <input
                  {...described(verifierId, verifierError, true)}
                  value={form.verifier}
                  maxLength={512}
                  placeholder="Qwen/Qwen3-8B"
                  autoComplete="off"
                  spellCheck={false}
                  list={`${verifierId}-models`}
                  onChange={(e) => update("verifier", e.target.value)}
                />
                <datalist id={`${verifierId}-models`} data-testid="local-verifiers">
                  {models.data?.data.map((m) => (
                    <option key={m.verifier} value={m.verifier}>
                      {m.num_hidden_layers} layers, under the models root
                    </option>
                  ))}
                </datalist>
              </Field>
              <VerifierPreview
                verifier={verifier}
                loading={verifierRef !== "" && (!inspectCurrent || inspect.isFetching)}
                failed={inspectError !== undefined}
              />
            </fieldset>

            <fieldset className="card">
              <legend>Speculator</legend>
              {form.candidates.length > 0 && (
                <p className="hint speculator-shared" data-testid="shared-settings">
                  With bake-off candidates (below), these are the settings every candidate starts from: only the
                  candidates are trained.
                </p>
              )}
              {selectField(
                "kind",
                "Kind",
                KINDS.map((k) => [k.kind, kindOption(k)] satisfies [Kind, string]),
                "dflash and eagle3 run anywhere; dspark and dflash2 are served only on a GPU host (the vllm runtime).",
              )}
              <div className="grid2">
                {isBlockKind(form.kind) ? numberField("blockSize", "Tokens drafted per step (2–64)") : numberField("tttSteps", "Tokens drafted per step (1–16)")}
                {numberField("numLayers", "Drafter depth (1–32)")}
              </div>
              <Field
                id={layersId}
                label="Target layer ids"
                error={layersError}
                hint={
                  defaultLayers
                    ? `Optional, comma-separated; empty: the verifier's default ${defaultLayers}`
                    : "Optional, comma-separated, ascending; empty: the verifier's default"
                }
              >
                <input
                  {...described(layersId, layersError, true)}
                  value={form.targetLayerIds}
                  placeholder={defaultLayers ?? "2, 6, 9"}
                  inputMode="numeric"
                  autoComplete="off"
                  onChange={(e) => update("targetLayerIds", e.target.value)}
                />
              </Field>
              <div className="grid2">
                {isBlockKind(form.kind) && numberField("maxAnchors")}
                {numberField("seqLen", form.candidates.length ? "Tokens per training sequence (shared)" : "Tokens per training sequence")}
                {numberField("epochs")}
                {numberField("lr")}
                {selectField("scheduler", "Scheduler", [
                  ["cosine", "cosine"],
                  ["linear", "linear"],
                  ["none", "none"],
                ] satisfies [Scheduler, string][])}
                {numberField("seed")}
              </div>
              {selectField(
                "mode",
                "Mode",
                [
                  ["online", "online: hidden states made on demand while training"],
                  ["offline", "offline: all hidden states made first, then trained on"],
                  ["hybrid", "hybrid: made first, what is missing made on demand"],
                ] satisfies [Mode, string][],
              )}
            </fieldset>
          </div>

          <div>
            <fieldset className="card">
              <legend>Runtime and resources</legend>
              {selectField(
                "runtime",
                "Runtime",
                [
                  ["", "Server default"],
                  ["local", "local (vLLM and the trainer on the CPU)"],
                  ["vllm", "vllm (GPUs)"],
                ] satisfies [Runtime, string][],
              )}
              {form.runtime === "local" || !gpus ? (
                <p className="hint" data-testid="local-resources">
                  {form.runtime === "local"
                    ? "The local runtime runs on a worker's CPU: there are no GPUs to choose."
                    : "No worker offers GPUs now: there are none to choose, and a job of the vllm runtime waits for a GPU worker."}{" "}
                  On two cores the API's defaults
                  (20 epochs of 8192-token sequences) take hours; “Use demo settings” is sized for a CPU. It serves dflash
                  and eagle3 drafters only: dspark and dflash2 need a GPU host (the vllm runtime).
                </p>
              ) : (
                <>
                  <div className="grid2">
                    {numberField("tensorParallel")}
                    {numberField("dataParallel")}
                  </div>
                  {numberField("trainerGpus")}
                  {checkField("shareGpus", P.shareGpus, "Trainer shares the verifier's GPUs (a host with one GPU)")}
                  {form.candidates.length > 0 &&
                    checkField(
                      "candidatesInParallel",
                      P.candidatesInParallel,
                      "Train the candidates side by side, each on trainer GPUs of its own (else one after another)",
                    )}
                </>
              )}
            </fieldset>

            <fieldset className="card">
              <legend>Evaluate, gate and publish</legend>
              <label className="check">
                <input
                  type="checkbox"
                  id={fieldId(P.evaluate)}
                  checked={form.evaluate}
                  aria-describedby={evaluateError ? `${fieldId(P.evaluate)}-error` : undefined}
                  onChange={(e) => update("evaluate", e.target.checked)}
                />
                Evaluate after training
              </label>
              {evaluateError && (
                <small className="field-error" id={`${fieldId(P.evaluate)}-error`} role="alert">
                  {evaluateError}
                </small>
              )}
              {form.evaluate && (
                <>
                  <div className="grid2">
                    {numberField("evalPrompts", "Held-out prompts served")}
                    {numberField("evalMaxTokens", "Tokens generated per prompt")}
                  </div>
                  {numberField("evalRounds", "Every engine answers the prompts this many times; the speedup is the median")}
                  {checkField("evalBaseline", P.evalBaseline, "Measure the speedup: also serve the verifier alone on the same prompts")}
                  {checkField("evalNgram", P.evalNgram, "Compare with n-gram drafting on the same prompts")}
                </>
              )}
              {selectField(
                "gate",
                "Acceptance gate",
                [
                  ["default", "Runtime default (vllm: speedup ≥ 1; local: none)"],
                  ["none", "No gate"],
                  ["custom", "Require…"],
                ] satisfies [GateChoice, string][],
                "What the evaluation must show before the drafter is published.",
              )}
              {form.gate === "custom" && (
                <>
                  <div className="grid2">
                    {numberField("gateMinAL", "Optional, 1–65")}
                    {numberField("gateMinSpeedup", "Optional, above 0")}
                  </div>
                  {checkField("gateBeatNgram", P.gateBeatNgram, "Must beat n-gram drafting")}
                </>
              )}
              <Field
                id={publishId}
                label="Publish to (Hub repo id)"
                error={publishError}
                hint="Optional: the best checkpoint is pushed there when the job succeeds (needs the HF_TOKEN secret)."
              >
                <input
                  {...described(publishId, publishError, true)}
                  value={form.publish}
                  maxLength={200}
                  placeholder="org/name"
                  autoComplete="off"
                  spellCheck={false}
                  onChange={(e) => update("publish", e.target.value)}
                />
              </Field>
            </fieldset>
          </div>
        </div>

        <fieldset className="card">
          <legend>Bake-off candidates</legend>
          <CandidateRows form={form} errorOf={errorOf} onChange={updateCandidates} />
        </fieldset>

        <PlanPreview
          plan={plan.data}
          state={planState}
          error={planCurrent && plan.isError ? planErrors.form : null}
        />

        <FormError message={submitErrors.form} />
        <div className="actions newjob-submit">
          <button type="submit" className="primary" disabled={create.isPending}>
            {create.isPending ? "Creating…" : "Create job"}
          </button>
          <Link to="/jobs">Cancel</Link>
          {submitted && !valid && (
            <span className="field-error" role="status">
              Fix the marked fields first.
            </span>
          )}
        </div>
      </form>
    </>
  );
}
