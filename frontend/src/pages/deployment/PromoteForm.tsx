// Promote the deployment to another checkpoint (POST .../promote), after a confirm. The
// checkpoint is picked from those a user would want (the other epochs of the job it serves, the
// evaluated checkpoint of each recent succeeded job for its verifier) or typed as an id; the
// API's 422 (no such checkpoint, another verifier's) and 409 (already served, a switch under
// way) are shown at the field or the form.
import { useState, type FormEvent } from "react";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type Deployment } from "../../api/client";
import { Field, FormError, described, useFieldErrors } from "../../components/form";
import { epochOf, evaluationOf, keys as jobKeys, num } from "../job/model";
import { shortId } from "./ids";
import { keys } from "./keys";

const CHECKPOINT_ID = /^ckpt_[0-9a-f]{24}$/; // app/schemas/jobs.py CHECKPOINT_ID

interface Candidate {
  id: string;
  label: string;
}

/** Checkpoints to offer: the served job's other epochs, then recent jobs' evaluated ones. */
function useCandidates(deployment: Deployment): Candidate[] {
  const source = deployment.source as { kind?: string; job_id?: string; checkpoint_id?: string };
  const sourceJob = source.kind === "checkpoint" ? source.job_id : undefined;
  const ofSourceJob = useQuery({
    queryKey: jobKeys.checkpoints(sourceJob ?? ""),
    queryFn: () => must(api.GET("/api/jobs/{job_id}/checkpoints", { params: { path: { job_id: sourceJob! } } })),
    enabled: sourceJob !== undefined,
  });
  const recent = useQuery({
    queryKey: ["jobs", "promote-candidates"],
    queryFn: () => must(api.GET("/api/jobs", { params: { query: { status: "succeeded", limit: 20 } } })),
  });
  // A bake-off's checkpoints are named by their candidate too.
  const sourceJobData = useQuery({
    queryKey: jobKeys.job(sourceJob ?? ""),
    queryFn: () => must(api.GET("/api/jobs/{job_id}", { params: { path: { job_id: sourceJob! } } })),
    enabled: sourceJob !== undefined,
  });
  const candidates = sourceJobData.data?.candidates ?? [];
  const found = new Map<string, string>();
  for (const c of ofSourceJob.data?.data ?? []) {
    const al = c.served_acceptance_length;
    const of = candidates.length > 1 ? `${candidates.find((x) => x.index === c.candidate)?.name ?? c.kind} ` : "";
    found.set(c.id, `${of}epoch ${epochOf(c.epoch)} of ${shortId(c.job_id)}${al != null ? `, served AL ${num(al, 2)}` : ""}`);
  }
  for (const job of recent.data?.data ?? []) {
    const evaluation = evaluationOf(job.evaluation);
    if (job.verifier !== deployment.verifier || !evaluation?.checkpoint_id || found.has(evaluation.checkpoint_id)) continue;
    const al = job.served_acceptance_length;
    found.set(
      evaluation.checkpoint_id,
      `epoch ${epochOf(evaluation.epoch)} of ${shortId(job.id)} (evaluated)${al != null ? `, served AL ${num(al, 2)}` : ""}`,
    );
  }
  found.delete(source.checkpoint_id ?? "");
  return [...found].map(([id, label]) => ({ id, label }));
}

export function PromoteForm({ deployment, onDone }: { deployment: Deployment; onDone: () => void }) {
  const [checkpointId, setCheckpointId] = useState("");
  const candidates = useCandidates(deployment);
  const { errors, setErrors, formError, fromError, clear } = useFieldErrors(["checkpoint_id"]);
  const queryClient = useQueryClient();
  const promote = useMutation({
    mutationFn: (id: string) =>
      must(
        api.POST("/api/deployments/{deployment_id}/promote", {
          params: { path: { deployment_id: deployment.id } },
          body: { checkpoint_id: id },
        }),
      ),
    onSuccess: () => {
      queryClient.invalidateQueries({ queryKey: keys.promotions(deployment.id) });
      queryClient.invalidateQueries({ queryKey: keys.events(deployment.id) });
      onDone();
    },
    onError: fromError,
  });

  function submit(event: FormEvent) {
    event.preventDefault();
    clear();
    const id = checkpointId.trim();
    if (!CHECKPOINT_ID.test(id)) {
      setErrors({ checkpoint_id: "A checkpoint id looks like ckpt_ followed by 24 hex digits" });
      document.getElementById("promote-checkpoint_id")?.focus();
      return;
    }
    const question =
      `Promote "${deployment.name}" to checkpoint ${id}? A new engine starts beside the current one; ` +
      "the route switches once it is ready, without downtime.";
    if (window.confirm(question)) promote.mutate(id);
  }

  return (
    <form className="flywheel-form" onSubmit={submit} noValidate aria-label="Promote to a checkpoint">
      {candidates.length > 0 && (
        <Field id="promote-pick" label="Pick a checkpoint" hint="Or type any checkpoint id of this project below.">
          <select
            {...described("promote-pick", undefined, true)}
            value={candidates.some((c) => c.id === checkpointId.trim()) ? checkpointId.trim() : ""}
            onChange={(e) => setCheckpointId(e.target.value)}
          >
            <option value="">Choose…</option>
            {candidates.map((c) => (
              <option key={c.id} value={c.id}>
                {c.label}
              </option>
            ))}
          </select>
        </Field>
      )}
      <Field
        id="promote-checkpoint_id"
        label="Checkpoint id"
        error={errors.checkpoint_id}
        hint="A checkpoint of this project (any drafter kind), trained for the deployment's verifier."
      >
        <input
          {...described("promote-checkpoint_id", errors.checkpoint_id, true)}
          className="mono"
          value={checkpointId}
          placeholder="ckpt_…"
          autoComplete="off"
          spellCheck={false}
          onChange={(e) => setCheckpointId(e.target.value)}
        />
      </Field>
      <FormError message={formError} />
      <div className="actions">
        <button type="submit" className="primary" disabled={promote.isPending}>
          {promote.isPending ? "Promoting…" : "Promote"}
        </button>
        <button type="button" onClick={onDone}>
          Close
        </button>
      </div>
    </form>
  );
}
