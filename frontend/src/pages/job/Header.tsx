// The job's identity and state: id, status and stage, why it failed, what it trains, when,
// how far it is, and the Cancel button while it can still be cancelled.
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { Link } from "react-router-dom";
import { api, must } from "../../api/client";
import { messageOf } from "../../api/errors";
import { StatusBadge } from "../../components/status";
import { Duration, RelTime } from "../../components/time";
import {
  isBakeoff,
  isTerminal,
  keys,
  num,
  progressOf,
  settingsText,
  STAGE_NAMES,
  stageProgressOf,
  stageStates,
  type Job,
} from "./model";
import { VerdictNote } from "./Verdict";

function Progress({ job }: { job: Job }) {
  // A stage after training with steps of its own (the served evaluation): its bar instead.
  const stage = stageProgressOf(job);
  if (stage) {
    return (
      <span className="progress" data-testid="stage-progress">
        <progress max={stage.total} value={stage.done} aria-label={`${STAGE_NAMES[job.stage ?? ""] ?? job.stage} progress`} />
        <span>{stage.text}</span>
      </span>
    );
  }
  const progress = job.progress;
  if (!progress) {
    return isTerminal(job.status) ? null : <span className="dim">no training step yet</span>;
  }
  // Steps once their total is known (after the first epoch), else the epochs completed: all of
  // them once the job is past training, else the ones before this.
  const total = progress.total_steps;
  const done = total != null ? progress.steps_done : job.status === "succeeded" ? progress.epochs : progress.epoch - 1;
  return (
    <span className="progress">
      <progress max={total ?? progress.epochs} value={done} aria-label="Training progress" />
      <span>{progressOf(job)}</span>
    </span>
  );
}

/** The pipeline's stages, this job's only, with the one under way marked (and where it
 * stopped, for a job that failed or was cancelled). */
function StageStrip({ job }: { job: Job }) {
  return (
    <ol className="stage-strip" aria-label="Pipeline stages">
      {stageStates(job).map(({ stage, state }) => (
        <li
          key={stage}
          className={`stage-${state}${!isTerminal(job.status) || job.stage !== stage ? "" : ` stage-ended-${job.status}`}`}
          aria-current={state === "current" ? "step" : undefined}
          data-state={state}
        >
          {STAGE_NAMES[stage] ?? stage}
        </li>
      ))}
    </ol>
  );
}

function CancelButton({ job }: { job: Job }) {
  const queryClient = useQueryClient();
  const cancel = useMutation({
    mutationFn: () => must(api.POST("/api/jobs/{job_id}/cancel", { params: { path: { job_id: job.id } } })),
    onSuccess: (updated) => {
      queryClient.setQueryData(keys.job(job.id), updated);
      queryClient.invalidateQueries({ queryKey: ["jobs"] });
    },
  });
  const cancelling = job.status === "cancelling";
  return (
    <div className="cancel">
      <button
        type="button"
        className="danger"
        disabled={cancel.isPending || cancelling}
        onClick={() => window.confirm(`Cancel job ${job.id}? Its processes are stopped.`) && cancel.mutate()}
      >
        {cancelling ? "Cancelling…" : "Cancel job"}
      </button>
      {cancel.error && (
        <div className="field-error" role="alert">
          {messageOf(cancel.error)}
        </div>
      )}
    </div>
  );
}

export function JobHeader({ job }: { job: Job }) {
  const spec = job.speculator as Record<string, unknown>;
  return (
    <header className="card job-head">
      <div className="job-title">
        <h1>
          {job.name ? <span className="job-name">{job.name}</span> : "Job"} <span className="mono">{job.id}</span>
        </h1>
        <div className="job-actions">
          <Link className="button" to={`/jobs/new?clone=${job.id}`} aria-label={`Clone job ${job.id}`}>
            Clone
          </Link>
          {!isTerminal(job.status) && <CancelButton job={job} />}
        </div>
      </div>
      <p className="job-state">
        <span>
          Status{" "}
          <span data-testid="job-status">
            <StatusBadge status={job.status} />
          </span>
        </span>
        <span>
          Stage <strong data-testid="job-stage">{job.stage ?? "—"}</strong>
        </span>
        <Progress job={job} />
      </p>
      <StageStrip job={job} />
      {job.verdict && <VerdictNote verdict={job.verdict} />}
      {(job.status === "failed" || job.status_reason) && (
        <div className={`state${job.status === "failed" ? " error" : ""}`} role={job.status === "failed" ? "alert" : undefined}>
          {job.error_code && <code className="error-code">{job.error_code}</code>} {job.status_reason ?? "No reason given."}
        </div>
      )}
      <dl className="kv job-kv">
        <dt>Verifier</dt>
        <dd className="mono">{job.verifier}</dd>
        <dt>Dataset</dt>
        <dd className="mono">{job.dataset}</dd>
        <dt>Runtime</dt>
        <dd>
          {job.runtime}, {job.mode} mode
        </dd>
        {isBakeoff(job) ? (
          <>
            <dt>Bake-off</dt>
            <dd data-testid="job-candidates">
              {job.candidates.length} candidates: {job.candidates.map((c) => `${c.name} (${c.kind})`).join(", ")}
            </dd>
            <dt>Winner</dt>
            <dd data-testid="job-winner">
              {job.winner ? (
                <strong>{job.winner}</strong>
              ) : isTerminal(job.status) ? (
                "none"
              ) : (
                <span className="dim">not yet ranked</span>
              )}
            </dd>
          </>
        ) : (
          <>
            <dt>Speculator</dt>
            <dd>
              {String(spec.type ?? "dflash")}: {settingsText(spec, String(spec.type ?? "dflash"))}
            </dd>
          </>
        )}
        {job.init_from && (
          <>
            <dt>Warm start</dt>
            <dd className="mono">{job.init_from}</dd>
          </>
        )}
        {job.metadata.retrain_of && (
          <>
            <dt>Retrains</dt>
            <dd>
              <Link to={`/deployments/${job.metadata.retrain_of}`} className="mono">
                {job.metadata.retrain_of}
              </Link>
            </dd>
          </>
        )}
        <dt>Served AL</dt>
        <dd>{num(job.served_acceptance_length, 2)}</dd>
        <dt>Created</dt>
        <dd>
          <RelTime at={job.created_at} past />
        </dd>
        <dt>Started</dt>
        <dd>
          <RelTime at={job.started_at} past />
        </dd>
        <dt>Finished</dt>
        <dd>
          <RelTime at={job.finished_at} past />
        </dd>
        <dt>Duration</dt>
        <dd>
          <Duration from={job.started_at} to={job.finished_at ?? (isTerminal(job.status) ? job.updated_at : null)} />
        </dd>
        {job.worker && (
          <>
            <dt>Worker</dt>
            <dd className="mono">
              {job.worker} (attempt {job.attempt})
            </dd>
          </>
        )}
        {job.publish && (
          <>
            <dt>Publish to</dt>
            <dd className="mono">{job.publish}</dd>
          </>
        )}
      </dl>
    </header>
  );
}
