// The deployment's card: its status (and why), what it serves, where and since when.
import { Link } from "react-router-dom";
import type { Deployment } from "../../api/client";
import { StatusBadge } from "../../components/status";
import { Duration, RelTime } from "../../components/time";
import { describeAllocation, isTerminal } from "../deploy/common";

function Source({ deployment }: { deployment: Deployment }) {
  const s = deployment.source as Record<string, unknown>;
  if (s.kind === "checkpoint") {
    return (
      <>
        checkpoint <span className="mono">{String(s.checkpoint_id)}</span> of job{" "}
        <Link to={`/jobs/${String(s.job_id)}`} className="mono">
          {String(s.job_id)}
        </Link>
      </>
    );
  }
  return (
    <>
      {String(s.kind ?? "drafter")}: <span className="mono">{String(s.drafter ?? deployment.drafter)}</span>
    </>
  );
}

export function Summary({ deployment }: { deployment: Deployment }) {
  const tp = (deployment.resources as { tensor_parallel_size?: number }).tensor_parallel_size;
  return (
    <section className="card" aria-label="Deployment">
      <div className="deploy-status">
        <span data-testid="deployment-status">
          <StatusBadge status={deployment.status} />
        </span>
        {!isTerminal(deployment) && deployment.status !== "ready" && <span className="spinner" aria-hidden="true" />}
        {deployment.status_reason && <span className="deploy-reason">{deployment.status_reason}</span>}
      </div>
      <dl className="kv">
        <dt>Source</dt>
        <dd>
          <Source deployment={deployment} />
        </dd>
        <dt>Drafter</dt>
        <dd className="mono">{deployment.drafter}</dd>
        <dt>Kind</dt>
        <dd>{deployment.kind}</dd>
        <dt>Verifier</dt>
        <dd className="mono">{deployment.verifier}</dd>
        <dt>Speculative tokens</dt>
        <dd>{deployment.num_speculative_tokens}</dd>
        <dt>Runtime</dt>
        <dd>{deployment.runtime}</dd>
        <dt>Tensor parallel</dt>
        <dd>{tp ?? "—"}</dd>
        <dt>Restarts</dt>
        <dd>{deployment.restarts}</dd>
        <dt>Worker</dt>
        <dd className="mono">{deployment.worker ?? "—"}</dd>
        <dt>Allocation</dt>
        <dd>{describeAllocation(deployment.allocation)}</dd>
        <dt>Created</dt>
        <dd>
          <RelTime at={deployment.created_at} />
        </dd>
        <dt>Started</dt>
        <dd>
          <RelTime at={deployment.started_at} />
        </dd>
        {deployment.started_at && (
          <>
            <dt>{deployment.finished_at ? "Ran for" : "Up for"}</dt>
            <dd>
              <Duration from={deployment.started_at} to={deployment.finished_at} />
            </dd>
          </>
        )}
        {deployment.finished_at && (
          <>
            <dt>Finished</dt>
            <dd>
              <RelTime at={deployment.finished_at} />
            </dd>
          </>
        )}
      </dl>
    </section>
  );
}
