import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { Link, useParams } from "react-router-dom";
import { api, must, type Deployment } from "../api/client";
import { messageOf } from "../api/errors";
import { CopyBlock } from "../components/copy";
import { ErrorNote, Loading, QueryState } from "../components/states";
import { StatusBadge } from "../components/status";
import { Duration, RelTime } from "../components/time";
import {
  DELETABLE,
  curlSnippet,
  describeAllocation,
  fetchDeploymentEvents,
  isTerminal,
  pythonSnippet,
} from "./deploy/common";
import "./deploy/deploy.css";

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

function Events({ deployment }: { deployment: Deployment }) {
  const events = useQuery({
    queryKey: ["deployment-events", deployment.id],
    queryFn: () => fetchDeploymentEvents(deployment.id),
    refetchInterval: isTerminal(deployment) ? false : 3000,
  });
  return (
    <section className="card" aria-label="Events">
      <h2>Events</h2>
      <QueryState
        query={events}
        what="Loading events"
        isEmpty={(list) => list.length === 0}
        empty={<p>No events.</p>}
      >
        {(list) => (
          <ol className="deploy-events" aria-label="Event timeline">
            {[...list].reverse().map((e) => (
              <li key={e.id}>
                <RelTime at={e.created_at} />
                {e.status && <StatusBadge status={e.status} />}
                <span className="dim">{e.kind}</span>
                <span className="deploy-event-message">{e.message}</span>
              </li>
            ))}
          </ol>
        )}
      </QueryState>
    </section>
  );
}

function Actions({ deployment }: { deployment: Deployment }) {
  const queryClient = useQueryClient();
  const remove = useMutation({
    mutationFn: () =>
      must(api.DELETE("/api/deployments/{deployment_id}", { params: { path: { deployment_id: deployment.id } } })),
    onSuccess: (updated) => {
      queryClient.setQueryData(["deployment", deployment.id], updated);
      queryClient.invalidateQueries({ queryKey: ["deployments"] });
      queryClient.invalidateQueries({ queryKey: ["deployment-events", deployment.id] });
    },
  });
  return (
    <div className="actions">
      {deployment.status === "ready" && (
        <Link className="button primary" to={`/playground?deployment=${encodeURIComponent(deployment.name)}`}>
          Open in playground
        </Link>
      )}
      {DELETABLE.has(deployment.status) && (
        <button
          type="button"
          className="danger"
          disabled={remove.isPending}
          onClick={() => window.confirm(`Delete deployment "${deployment.name}"? It stops serving.`) && remove.mutate()}
        >
          {remove.isPending ? "Deleting…" : "Delete deployment"}
        </button>
      )}
      {remove.error && (
        <span className="field-error" role="alert">
          {messageOf(remove.error)}
        </span>
      )}
    </div>
  );
}

function Snippets({ deployment }: { deployment: Deployment }) {
  return (
    <section className="card" aria-label="Use it">
      <h2>Use it</h2>
      <p className="hint">
        An OpenAI-compatible endpoint at <code>{window.location.origin}/v1</code>, model{" "}
        <code>{deployment.name}</code>. Set <code>SPECDECK_API_KEY</code> to one of your API keys (
        <Link to="/settings">Settings</Link>).
        {deployment.status !== "ready" && " It answers once the deployment is ready."}
      </p>
      <CopyBlock label="curl" text={curlSnippet(deployment.name)} />
      <CopyBlock label="Python (openai)" text={pythonSnippet(deployment.name)} />
    </section>
  );
}

function Detail({ deployment }: { deployment: Deployment }) {
  const tp = (deployment.resources as { tensor_parallel_size?: number }).tensor_parallel_size;
  return (
    <>
      <div className="toolbar deploy-head">
        <div>
          <h1>{deployment.name}</h1>
          <div className="mono dim">{deployment.id}</div>
        </div>
        <span className="spacer" />
        <Actions deployment={deployment} />
      </div>
      <div className="split">
        <div>
          <section className="card" aria-label="Deployment">
            <div className="deploy-status">
              <span data-testid="deployment-status">
                <StatusBadge status={deployment.status} />
              </span>
              {!isTerminal(deployment) && deployment.status !== "ready" && (
                <span className="spinner" aria-hidden="true" />
              )}
              {deployment.status_reason && <span className="deploy-reason">{deployment.status_reason}</span>}
            </div>
            <dl className="kv">
              <dt>Source</dt>
              <dd>
                <Source deployment={deployment} />
              </dd>
              <dt>Drafter</dt>
              <dd className="mono">{deployment.drafter}</dd>
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
          {!isTerminal(deployment) && <Snippets deployment={deployment} />}
        </div>
        <Events deployment={deployment} />
      </div>
    </>
  );
}

export default function DeploymentDetail() {
  const { deploymentId = "" } = useParams();
  const deployment = useQuery({
    queryKey: ["deployment", deploymentId],
    queryFn: () =>
      must(api.GET("/api/deployments/{deployment_id}", { params: { path: { deployment_id: deploymentId } } })),
    refetchInterval: (query) => (query.state.data && isTerminal(query.state.data) ? false : 2000),
  });
  return (
    <>
      <p className="deploy-crumbs">
        <Link to="/deployments">← Deployments</Link>
      </p>
      {deployment.isPending ? (
        <Loading what="Loading deployment" />
      ) : deployment.data ? (
        <>
          {deployment.error && <ErrorNote error={deployment.error} retry={() => deployment.refetch()} />}
          <Detail deployment={deployment.data} />
        </>
      ) : (
        <ErrorNote error={deployment.error} retry={() => deployment.refetch()} />
      )}
    </>
  );
}
