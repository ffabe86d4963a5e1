// What the API makes of the form before the job exists: the verifier's config (POST
// /api/verifiers/inspect) and the job's plan (POST /api/jobs/plan, a dry run).
import { useEffect, useState } from "react";
import type { Plan, Verifier } from "../../api/client";
import { Loading } from "../../components/states";
import { commandLine } from "./form";

/** `value`, once it has stayed the same for `ms`. */
export function useDebounced<T>(value: T, ms: number): T {
  const [settled, setSettled] = useState(value);
  useEffect(() => {
    const timer = setTimeout(() => setSettled(value), ms);
    return () => clearTimeout(timer);
  }, [value, ms]);
  return settled;
}

export function VerifierPreview({
  verifier,
  loading,
  failed,
}: {
  verifier: Verifier | undefined;
  loading: boolean;
  failed: boolean;
}) {
  let body;
  if (loading) body = <Loading what="Reading the verifier's config.json" />;
  else if (verifier)
    body = (
      <dl className="kv">
        <dt>Layers</dt>
        <dd>{verifier.num_hidden_layers}</dd>
        <dt>Hidden size</dt>
        <dd>{verifier.hidden_size}</dd>
        <dt>Vocabulary</dt>
        <dd>{verifier.vocab_size}</dd>
        <dt>Dtype</dt>
        <dd>{verifier.dtype ?? "—"}</dd>
        <dt>Source</dt>
        <dd>
          {verifier.source === "hub" ? "Hugging Face Hub" : "models root"}{" "}
          <span className="mono dim">{verifier.verifier}</span>
        </dd>
        <dt>Default target layers</dt>
        <dd>{verifier.default_target_layer_ids?.join(", ") ?? "none (too shallow: name them)"}</dd>
      </dl>
    );
  else
    body = (
      <p className="hint">
        {failed ? "No preview: see the error above." : "Name a verifier to see its layers, sizes and dtype."}
      </p>
    );
  return (
    <section aria-label="Verifier preview" className="preview">
      <h3>Verifier preview</h3>
      {body}
    </section>
  );
}

export function PlanPreview({
  plan,
  state,
  error,
}: {
  plan: Plan | undefined;
  state: "incomplete" | "loading" | "error" | "ready";
  error: string | null;
}) {
  let body;
  if (state === "incomplete")
    body = <p className="hint">Complete the form to see the plan: each stage's GPUs and command.</p>;
  else if (state === "loading" && !plan) body = <Loading what="Building the plan" />;
  else if (state === "error")
    body = (
      <p className="field-error" role="alert">
        {error ?? "The form has a problem: see the field marked above."}
      </p>
    );
  else if (plan)
    body = (
      <>
        <dl className="kv">
          <dt>Runtime</dt>
          <dd>
            {plan.runtime}
            {state === "loading" && <span className="dim"> (updating…)</span>}
          </dd>
          {Object.entries(plan.gpus).map(([role, gpus]) => (
            <FragmentKV key={role} label={`GPUs, ${role}`} value={gpuList(gpus)} />
          ))}
          {Object.entries(plan.layer_ids).map(([role, ids]) => (
            <FragmentKV key={role} label={`Layer ids, ${role.replace(/_/g, " ")}`} value={ids.join(", ")} />
          ))}
        </dl>
        <ol className="plan-stages">
          {plan.stages.map((stage, i) => (
            <li key={i}>
              <details>
                <summary>
                  <span className="mono">{stage.stage}</span> <span className="dim">{stage.description}</span>{" "}
                  <span className="plan-gpus">GPUs: {gpuList(stage.gpus)}</span>
                </summary>
                <pre className="log">
                  <code>{commandLine(stage.argv)}</code>
                </pre>
              </details>
            </li>
          ))}
        </ol>
      </>
    );
  return (
    <section aria-label="Plan preview" className="card">
      <h2>Plan preview</h2>
      {body}
    </section>
  );
}

/** GPU ids with runs shortened: [0, 1, 2, 3, 5] as "0–3, 5"; none: "none (CPU)". */
function gpuList(ids: number[]): string {
  if (!ids.length) return "none (CPU)";
  const runs: string[] = [];
  for (let i = 0; i < ids.length; ) {
    let j = i;
    while (j + 1 < ids.length && ids[j + 1] === ids[j] + 1) j++;
    runs.push(j > i ? `${ids[i]}–${ids[j]}` : String(ids[i]));
    i = j + 1;
  }
  return runs.join(", ");
}

function FragmentKV({ label, value }: { label: string; value: string }) {
  return (
    <>
      <dt>{label}</dt>
      <dd>{value}</dd>
    </>
  );
}
