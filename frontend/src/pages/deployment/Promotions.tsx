// The deployment's drafters over time (GET .../promotions, newest first): each promotion and
// rollback, from which drafter to which, its step and outcome (with replicas, each one's too).
// Promote (to a checkpoint), Roll back (to the drafter served before) and Retrain (a job on the
// captured traffic) start here.
import { useState } from "react";
import { Link } from "react-router-dom";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type Deployment, type Promotion } from "../../api/client";
import { ConfirmAction } from "../../components/confirm";
import { QueryState } from "../../components/states";
import { StatusBadge } from "../../components/status";
import { Duration, RelTime } from "../../components/time";
import { isTerminal } from "../deploy/common";
import { shortId } from "./ids";
import { keys } from "./keys";
import { PromoteForm } from "./PromoteForm";
import { RetrainForm } from "./RetrainForm";

/** app/services/promotions.py SERVING: only these switch drafters. */
const SERVING = new Set(["starting", "ready"]);
const ACTIVE = new Set(["pending", "starting", "draining"]);
const STEPS = ["pending", "starting", "draining", "succeeded"];

/** An id shortened; hover: all of it. */
function ShortId({ id }: { id: string }) {
  return (
    <span className="mono" title={id}>
      {shortId(id)}
    </span>
  );
}

/** A promotion's target or previous drafter: a checkpoint of a job, or a drafter by name. */
function DrafterRef({ drafter }: { drafter: Record<string, unknown> | null | undefined }) {
  if (!drafter) return <span className="dim">—</span>;
  const source = (drafter.source ?? {}) as Record<string, unknown>;
  if (source.kind === "checkpoint") {
    const job = String(source.job_id);
    return (
      <span className="promotion-drafter">
        <ShortId id={String(source.checkpoint_id)} />
        <span className="dim small">
          of job{" "}
          <Link to={`/jobs/${job}`}>
            <ShortId id={job} />
          </Link>
        </span>
      </span>
    );
  }
  return <span className="mono promotion-drafter">{String(drafter.drafter ?? "—")}</span>;
}

function Step({ promotion }: { promotion: Promotion }) {
  if (promotion.status === "failed")
    return (
      <div className="field-error">
        {promotion.status_reason ?? "failed"};{" "}
        {promotion.replicas.length > 1 ? "that replica serves its previous drafter on" : "the previous drafter serves on"}
      </div>
    );
  if (promotion.status === "succeeded")
    return (
      <div className="dim small">
        switched in <Duration from={promotion.created_at} to={promotion.finished_at} />
      </div>
    );
  return (
    <div className="dim small">
      step {STEPS.indexOf(promotion.status) + 1} of {STEPS.length}
      {promotion.status_reason && `: ${promotion.status_reason}`}
    </div>
  );
}

/** With replicas, each one's switch: they start, switch and drain on their own workers. */
function ReplicaSteps({ promotion }: { promotion: Promotion }) {
  if (promotion.replicas.length < 2) return null;
  return (
    <ul className="replica-steps" aria-label="Each replica's step">
      {promotion.replicas.map((step) => (
        <li key={step.replica} title={step.status_reason ?? undefined}>
          <span className="dim small">replica {step.replica}</span> <StatusBadge status={step.status} />
        </li>
      ))}
    </ul>
  );
}

function Row({ promotion }: { promotion: Promotion }) {
  return (
    <tr>
      <td>
        <strong>{promotion.kind}</strong>
        <div className="dim small">
          <RelTime at={promotion.created_at} />
        </div>
        {promotion.job_id && (
          <div className="dim small">
            by job{" "}
            <Link to={`/jobs/${promotion.job_id}`}>
              <ShortId id={promotion.job_id} />
            </Link>
          </div>
        )}
      </td>
      <td>
        <div className="promotion-drafters">
          <DrafterRef drafter={promotion.previous} />
          <span aria-label="to">→</span>
          <DrafterRef drafter={promotion.target} />
        </div>
      </td>
      <td>
        <StatusBadge status={promotion.status} />
        <Step promotion={promotion} />
        <ReplicaSteps promotion={promotion} />
      </td>
    </tr>
  );
}

function RollBack({ deployment, switched }: { deployment: Deployment; switched: boolean }) {
  const queryClient = useQueryClient();
  const rollback = useMutation({
    mutationFn: () =>
      must(
        api.POST("/api/deployments/{deployment_id}/rollback", { params: { path: { deployment_id: deployment.id } } }),
      ),
    onSuccess: () => {
      queryClient.invalidateQueries({ queryKey: keys.promotions(deployment.id) });
      queryClient.invalidateQueries({ queryKey: keys.events(deployment.id) });
    },
  });
  return (
    <ConfirmAction
      label="Roll back"
      name={`Roll back deployment ${deployment.name}`}
      question={`Roll back "${deployment.name}" to the drafter it served before? It switches without downtime: the old drafter's engine starts beside the current one.`}
      action={rollback}
      unavailable={switched ? undefined : "Nothing to roll back to: it serves the drafter it was created with"}
    />
  );
}

export function Promotions({ deployment }: { deployment: Deployment }) {
  const [open, setOpen] = useState<"promote" | "retrain" | null>(null);
  const serving = SERVING.has(deployment.status);
  const promotions = useQuery({
    queryKey: keys.promotions(deployment.id),
    queryFn: () =>
      must(
        api.GET("/api/deployments/{deployment_id}/promotions", {
          params: { path: { deployment_id: deployment.id }, query: { limit: 20 } },
        }),
      ),
    // Every 2 s while one is under way; a job's "deploy" option may start one at any time.
    refetchInterval: (query) =>
      query.state.data?.data.some((p) => ACTIVE.has(p.status)) ? 2000 : isTerminal(deployment) ? false : 10_000,
  });
  const toggle = (form: "promote" | "retrain") => setOpen((now) => (now === form ? null : form));
  return (
    <section className="card promotions" aria-labelledby="promotions-title">
      <div className="promotions-head">
        <h2 id="promotions-title">Promotions</h2>
        <div className="actions">
          {serving && (
            <button type="button" className="small" aria-expanded={open === "promote"} onClick={() => toggle("promote")}>
              Promote…
            </button>
          )}
          <button type="button" className="small" aria-expanded={open === "retrain"} onClick={() => toggle("retrain")}>
            Retrain…
          </button>
          {serving && (
            <RollBack
              deployment={deployment}
              // What the API rolls back to: the drafter before the latest switch that succeeded.
              switched={promotions.data?.data.some((p) => p.status === "succeeded") ?? false}
            />
          )}
        </div>
      </div>
      <p className="hint">
        Switches of the drafter without downtime: the new engine starts beside the old one, the route switches once it is
        ready, the old one finishes its requests. A new engine that fails leaves the old one serving.
      </p>
      {open === "promote" && <PromoteForm deployment={deployment} onDone={() => setOpen(null)} />}
      {open === "retrain" && <RetrainForm deployment={deployment} onClose={() => setOpen(null)} />}
      <QueryState
        query={promotions}
        what="Loading promotions"
        isEmpty={(page) => page.data.length === 0}
        empty="No promotions yet: this deployment serves the drafter it was created with."
      >
        {(page) => (
          <>
            <div className="table-wrap">
              <table aria-label="Promotions">
                <thead>
                  <tr>
                    <th>Kind</th>
                    <th>From → to</th>
                    <th>Status</th>
                  </tr>
                </thead>
                <tbody>
                  {page.data.map((p) => (
                    <Row key={p.id} promotion={p} />
                  ))}
                </tbody>
              </table>
            </div>
            {page.has_more && <p className="hint">The 20 newest.</p>}
          </>
        )}
      </QueryState>
    </section>
  );
}
