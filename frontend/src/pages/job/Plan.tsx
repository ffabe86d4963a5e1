// What the job runs (GET /api/jobs/{id}/plan), fetched when the reader opens it.
import { useState } from "react";
import { useQuery } from "@tanstack/react-query";
import { api, must, type Plan as PlanOut } from "../../api/client";
import { CopyBlock } from "../../components/copy";
import { QueryState } from "../../components/states";
import { keys } from "./model";

const quote = (s: string) => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

/** argv as a command a POSIX shell reads back the same, its environment in front, each
 * --option on a line of its own. */
export function shellCommand(argv: string[], env: Record<string, string> = {}): string {
  const words = [...Object.entries(env).map(([k, v]) => `${k}=${quote(v)}`), ...argv.map(quote)];
  if (words.length === 0) return "";
  return words.reduce((text, word) => (word.startsWith("--") ? `${text} \\\n    ${word}` : `${text} ${word}`));
}

const ids = (list: number[]) => (list.length ? list.join(", ") : "none");

function KvRow({ term, value }: { term: string; value: string }) {
  return (
    <>
      <dt>{term}</dt>
      <dd className="mono">{value}</dd>
    </>
  );
}

function PlanBody({ plan }: { plan: PlanOut }) {
  return (
    <>
      <dl className="kv">
        <dt>Runtime</dt>
        <dd>{plan.runtime}</dd>
        {Object.entries(plan.layer_ids).map(([who, layers]) => (
          <KvRow key={`layers-${who}`} term={`Layer ids (${who})`} value={ids(layers)} />
        ))}
        {Object.entries(plan.gpus).map(([who, gpus]) => (
          <KvRow key={`gpus-${who}`} term={`GPUs (${who})`} value={ids(gpus)} />
        ))}
      </dl>
      <ol className="plan-stages">
        {plan.stages.map((stage, i) => (
          <li key={`${stage.stage}-${i}`}>
            <h3 className="mono">{stage.stage}</h3>
            <p className="hint">
              {stage.description}; GPUs {ids(stage.gpus)}
            </p>
            <CopyBlock label={`Stage ${i + 1} command`} text={shellCommand(stage.argv, stage.env)} />
          </li>
        ))}
      </ol>
    </>
  );
}

export function Plan({ jobId }: { jobId: string }) {
  const [open, setOpen] = useState(false);
  const plan = useQuery({
    queryKey: keys.plan(jobId),
    queryFn: () => must(api.GET("/api/jobs/{job_id}/plan", { params: { path: { job_id: jobId } } })),
    enabled: open,
    staleTime: Infinity,
  });
  return (
    <details className="card plan" onToggle={(e) => setOpen(e.currentTarget.open)}>
      <summary>Plan</summary>
      {open && (
        <QueryState query={plan} what="Loading the plan" isEmpty={(p) => p.stages.length === 0} empty="The plan has no stages.">
          {(p) => <PlanBody plan={p} />}
        </QueryState>
      )}
    </details>
  );
}
