// The job's checkpoints: the trainer's validation numbers (estimates), what serving measured,
// where each is published; Publish (inline form) and Deploy per row. A bake-off's are grouped by
// candidate, with a column that names it and its kind.
import { Fragment, useState } from "react";
import { useNavigate } from "react-router-dom";
import type { Checkpoint } from "../../api/client";
import { StatusBadge } from "../../components/status";
import { RelTime } from "../../components/time";
import { KINDS, epochOf, evaluationOf, isBakeoff, num, type Job } from "./model";
import { PublishForm } from "./PublishForm";
import { VerdictBadge } from "./Verdict";

const metric = (c: Checkpoint, name: string) => {
  const value = c.metrics?.[name];
  return typeof value === "number" ? value : null;
};

function Served({ checkpoint }: { checkpoint: Checkpoint }) {
  const evaluation = evaluationOf(checkpoint.evaluation);
  if (!evaluation) return <span className="dim">not evaluated</span>;
  return (
    <span>
      <strong>{num(checkpoint.served_acceptance_length ?? evaluation.mean_acceptance_length, 2)}</strong>
      {evaluation.speedup != null && <span className="dim"> · ×{num(evaluation.speedup, 2)}</span>}
      {evaluation.ngram_mean_acceptance_length != null && (
        <div className="dim small">n-gram {num(evaluation.ngram_mean_acceptance_length, 2)}</div>
      )}
      {checkpoint.verdict && (
        <div>
          <VerdictBadge verdict={checkpoint.verdict} />
        </div>
      )}
    </span>
  );
}

function Published({ checkpoint }: { checkpoint: Checkpoint }) {
  if (!checkpoint.publish_status) return <span className="dim">not published</span>;
  return (
    <div>
      <StatusBadge status={checkpoint.publish_status} />
      {checkpoint.hub_url && (
        <div>
          <a href={checkpoint.hub_url} target="_blank" rel="noreferrer">
            {checkpoint.hub_repo ?? checkpoint.hub_url}
          </a>{" "}
          <RelTime at={checkpoint.published_at} />
        </div>
      )}
      {checkpoint.publish_error && <div className="field-error">{checkpoint.publish_error}</div>}
    </div>
  );
}

function Row({
  checkpoint,
  suggested,
  candidate,
}: {
  checkpoint: Checkpoint;
  suggested: string | null;
  candidate: { name: string; winner: boolean } | null; // a bake-off's candidate it is of
}) {
  const [publishing, setPublishing] = useState(false);
  const navigate = useNavigate();
  const selected = evaluationOf(checkpoint.evaluation)?.selected;
  // Which one, in words: "checkpoint 2" in a plain job, "checkpoint dflash-b4 epoch 2" in a bake-off.
  const which = candidate ? `${candidate.name} epoch ${epochOf(checkpoint.epoch)}` : epochOf(checkpoint.epoch);
  return (
    <Fragment>
      <tr className={checkpoint.is_best ? "best" : undefined}>
        {candidate && (
          <td>
            <strong>{candidate.name}</strong>
            {candidate.winner && <span className="dim small"> (winner)</span>}
            <div className="dim small">{KINDS.find((k) => k.kind === checkpoint.kind)?.label ?? checkpoint.kind}</div>
          </td>
        )}
        <td>
          <strong data-testid="checkpoint-epoch">{epochOf(checkpoint.epoch)}</strong>{" "}
          {checkpoint.is_best && (
            <span className="badge good" title="The trainer's best checkpoint (lowest validation loss)">
              best
            </span>
          )}{" "}
          {selected && (
            <span className="badge busy" title="The checkpoint the served evaluation chose">
              evaluated
            </span>
          )}
          {checkpoint.partial && (
            <span
              className="badge wait"
              data-testid="partial-badge"
              title="Saved when the trainer was stopped during this epoch: the weights so far, not the epoch's end. Never the best nor evaluated; it can still be deployed or warm-started from."
            >
              partial: stopped mid-epoch
            </span>
          )}
          <div className="mono dim small hide-narrow">{checkpoint.id}</div>
        </td>
        <td className="num">{num(metric(checkpoint, "loss_epoch"), 4)}</td>
        <td className="num hide-narrow">{num(metric(checkpoint, "eal_epoch"), 2)}</td>
        <td>
          <Served checkpoint={checkpoint} />
        </td>
        <td className="hide-narrow">
          <Published checkpoint={checkpoint} />
        </td>
        <td>
          <div className="actions">
            <button
              type="button"
              className="small"
              aria-label={`Publish checkpoint ${which}`}
              aria-expanded={publishing}
              disabled={checkpoint.publish_status === "publishing"}
              onClick={() => setPublishing((open) => !open)}
            >
              Publish
            </button>
            <button
              type="button"
              className="small"
              aria-label={`Deploy checkpoint ${which}`}
              onClick={() => navigate(`/deployments/new?checkpoint=${encodeURIComponent(checkpoint.id)}`)}
            >
              Deploy
            </button>
          </div>
        </td>
      </tr>
      {publishing && (
        <tr className="publish-row">
          <td colSpan={candidate ? 7 : 6}>
            <PublishForm checkpoint={checkpoint} suggested={suggested} onDone={() => setPublishing(false)} />
          </td>
        </tr>
      )}
    </Fragment>
  );
}

export function CheckpointsTable({
  checkpoints,
  suggested,
  job,
}: {
  checkpoints: Checkpoint[];
  suggested: string | null;
  job?: Job;
}) {
  const bakeoff = job !== undefined && isBakeoff(job);
  const candidateOf = (c: Checkpoint) => job?.candidates.find((x) => x.index === c.candidate) ?? null;
  // A bake-off's checkpoints by candidate (in the job's order), each candidate's by epoch.
  const rows = bakeoff ? [...checkpoints].sort((a, b) => a.candidate - b.candidate || a.epoch - b.epoch) : checkpoints;
  return (
    <div className="table-wrap">
      <table aria-label="Checkpoints">
        <thead>
          <tr>
            {bakeoff && <th>Candidate</th>}
            <th>Epoch</th>
            <th className="num" title="The trainer's validation loss">
              Val loss
            </th>
            <th className="num hide-narrow" title="The trainer's validation eal: an estimate of the acceptance length">
              eal (estimate)
            </th>
            <th title="Mean acceptance length measured by serving the checkpoint">Served AL</th>
            <th className="hide-narrow">Hub</th>
            <th>
              <span className="sr-only">Actions</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {rows.map((c) => {
            const candidate = bakeoff ? candidateOf(c) : null;
            return (
              <Row
                key={c.id}
                checkpoint={c}
                suggested={suggested}
                candidate={bakeoff ? { name: candidate?.name ?? `#${c.candidate + 1}`, winner: candidate?.winner ?? false } : null}
              />
            );
          })}
        </tbody>
      </table>
    </div>
  );
}
