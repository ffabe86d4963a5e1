// The job's checkpoints: the trainer's validation numbers (estimates), what serving measured,
// where each is published; Publish (inline form) and Deploy per row.
import { Fragment, useState } from "react";
import { useNavigate } from "react-router-dom";
import type { Checkpoint } from "../../api/client";
import { StatusBadge } from "../../components/status";
import { RelTime } from "../../components/time";
import { epochOf, evaluationOf, num } from "./model";
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

function Row({ checkpoint, suggested }: { checkpoint: Checkpoint; suggested: string | null }) {
  const [publishing, setPublishing] = useState(false);
  const navigate = useNavigate();
  const selected = evaluationOf(checkpoint.evaluation)?.selected;
  return (
    <Fragment>
      <tr className={checkpoint.is_best ? "best" : undefined}>
        <td>
          <strong>{epochOf(checkpoint.epoch)}</strong>{" "}
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
              aria-label={`Publish checkpoint ${epochOf(checkpoint.epoch)}`}
              aria-expanded={publishing}
              disabled={checkpoint.publish_status === "publishing"}
              onClick={() => setPublishing((open) => !open)}
            >
              Publish
            </button>
            <button
              type="button"
              className="small"
              aria-label={`Deploy checkpoint ${epochOf(checkpoint.epoch)}`}
              onClick={() => navigate(`/deployments/new?checkpoint=${encodeURIComponent(checkpoint.id)}`)}
            >
              Deploy
            </button>
          </div>
        </td>
      </tr>
      {publishing && (
        <tr className="publish-row">
          <td colSpan={6}>
            <PublishForm checkpoint={checkpoint} suggested={suggested} onDone={() => setPublishing(false)} />
          </td>
        </tr>
      )}
    </Fragment>
  );
}

export function CheckpointsTable({ checkpoints, suggested }: { checkpoints: Checkpoint[]; suggested: string | null }) {
  return (
    <div className="table-wrap">
      <table aria-label="Checkpoints">
        <thead>
          <tr>
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
          {checkpoints.map((c) => (
            <Row key={c.id} checkpoint={c} suggested={suggested} />
          ))}
        </tbody>
      </table>
    </div>
  );
}
