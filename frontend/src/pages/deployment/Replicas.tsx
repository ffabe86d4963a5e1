// The deployment's replicas: each engine's status, worker and restarts, and the count, changed
// in place (PATCH /api/deployments/{id}); the API's 409 (a deployment that ended) and 422 are
// shown at the field.
import { useState, type FormEvent } from "react";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { api, must, type Deployment } from "../../api/client";
import { Field, FormError, described, useFieldErrors } from "../../components/form";
import { StatusBadge } from "../../components/status";
import { RelTime } from "../../components/time";
import { isTerminal } from "../deploy/common";
import { keys } from "./keys";

const MAX_REPLICAS = 16; // app/schemas/deployments.py MAX_REPLICAS

function ScaleForm({ deployment }: { deployment: Deployment }) {
  const [count, setCount] = useState(String(deployment.replicas));
  const { errors, setErrors, formError, fromError, clear } = useFieldErrors(["replicas"]);
  const queryClient = useQueryClient();
  const scale = useMutation({
    mutationFn: (replicas: number) =>
      must(
        api.PATCH("/api/deployments/{deployment_id}", {
          params: { path: { deployment_id: deployment.id } },
          body: { replicas },
        }),
      ),
    onSuccess: (updated) => {
      queryClient.setQueryData(keys.deployment(deployment.id), updated);
      queryClient.invalidateQueries({ queryKey: ["deployments"] });
      queryClient.invalidateQueries({ queryKey: keys.events(deployment.id) });
    },
    onError: fromError,
  });

  function submit(event: FormEvent) {
    event.preventDefault();
    clear();
    const replicas = Number(count);
    if (!Number.isInteger(replicas) || replicas < 1 || replicas > MAX_REPLICAS) {
      setErrors({ replicas: `A whole number from 1 to ${MAX_REPLICAS}` });
      document.getElementById("scale-replicas")?.focus();
      return;
    }
    scale.mutate(replicas);
  }

  return (
    <form className="flywheel-form scale-form" onSubmit={submit} noValidate aria-label="Scale">
      <Field
        id="scale-replicas"
        label="Replicas"
        error={errors.replicas}
        hint="Each replica is an engine on a worker slot of its own; the gateway balances over the ready ones."
      >
        <input
          {...described("scale-replicas", errors.replicas, true)}
          type="number"
          min={1}
          max={MAX_REPLICAS}
          value={count}
          onChange={(e) => setCount(e.target.value)}
        />
      </Field>
      <FormError message={formError} />
      <div className="actions">
        <button type="submit" disabled={scale.isPending || Number(count) === deployment.replicas}>
          {scale.isPending ? "Scaling…" : "Scale"}
        </button>
      </div>
    </form>
  );
}

export function Replicas({ deployment }: { deployment: Deployment }) {
  return (
    <section className="card" aria-label="Replicas">
      <h2>
        Replicas <span className="dim">({deployment.replica_states.filter((r) => r.status === "ready").length} of{" "}
        {deployment.replicas} ready)</span>
      </h2>
      <table className="replicas">
        <thead>
          <tr>
            <th>#</th>
            <th>Status</th>
            <th>Worker</th>
            <th>Restarts</th>
            <th>Started</th>
          </tr>
        </thead>
        <tbody>
          {deployment.replica_states.map((r) => (
            <tr key={r.replica} data-testid={`replica-${r.replica}`}>
              <td>{r.replica}</td>
              <td title={r.status_reason ?? undefined}>
                <StatusBadge status={r.status} />
              </td>
              <td className="mono">{r.worker ?? "—"}</td>
              <td>{r.restarts}</td>
              <td>
                <RelTime at={r.started_at} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {!isTerminal(deployment) && <ScaleForm deployment={deployment} />}
    </section>
  );
}
