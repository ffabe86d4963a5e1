// Traffic capture (deployment.capture, app/schemas/capture.py): its settings, how full its
// dataset is against the limits, what was dropped, and the dataset itself, which a retrain uses.
import { Link } from "react-router-dom";
import type { Capture as CaptureOut, Deployment } from "../../api/client";
import { RelTime } from "../../components/time";
import { bytes } from "../Datasets";
import { num } from "../job/model";

function Usage({ label, used, limit, show }: { label: string; used: number; limit: number; show: (n: number) => string }) {
  const share = limit > 0 ? Math.min(1, used / limit) : 0;
  return (
    <div className="capture-usage">
      <div className="capture-usage-text">
        <span>{label}</span>
        <span>
          {show(used)} of {show(limit)} <span className="dim">({num(share * 100, 1)} %)</span>
        </span>
      </div>
      <meter min={0} max={limit} value={used} high={limit * 0.9} optimum={0} aria-label={`${label} used`} />
    </div>
  );
}

function Settings({ capture }: { capture: CaptureOut }) {
  const dropped = capture.dropped.queue_full + capture.dropped.limit_reached;
  return (
    <>
      <Usage label="Rows" used={capture.rows} limit={capture.max_rows} show={(n) => num(n, 0)} />
      <Usage label="Size" used={capture.bytes} limit={capture.max_bytes} show={bytes} />
      <dl className="kv capture-kv">
        <dt>Dataset</dt>
        <dd>
          {capture.dataset_id ? (
            <Link to={`/datasets#${capture.dataset_id}`} className="mono">
              {capture.dataset_id}
            </Link>
          ) : (
            <span className="dim">deleted: capture stopped</span>
          )}
        </dd>
        <dt>Sample rate</dt>
        <dd>{num(capture.sample_rate * 100, 2)} % of requests</dd>
        <dt>Retention</dt>
        <dd>
          {capture.retention_days} day{capture.retention_days === 1 ? "" : "s"}
        </dd>
        <dt>Dropped</dt>
        <dd>
          {dropped === 0 ? (
            "none"
          ) : (
            <>
              {num(capture.dropped.queue_full, 0)} queue full, {num(capture.dropped.limit_reached, 0)} at the limits
            </>
          )}
        </dd>
        <dt>Oldest row</dt>
        <dd>
          <RelTime at={capture.first_at} />
        </dd>
        <dt>Newest row</dt>
        <dd>
          <RelTime at={capture.last_at} />
        </dd>
      </dl>
    </>
  );
}

export function Capture({ deployment }: { deployment: Deployment }) {
  const capture = deployment.capture;
  return (
    <section className="card" aria-labelledby="capture-title">
      <h2 id="capture-title">Traffic capture</h2>
      {capture ? (
        <>
          <p className="hint">
            Sampled requests and their replies, encrypted at rest, recorded into a dataset of the project: what a retrain
            learns from.
          </p>
          <Settings capture={capture} />
        </>
      ) : (
        <p className="hint">
          Off. Capture is chosen when a deployment is created (the <code>capture</code> option of New deployment); a
          retrain of this deployment needs a dataset named instead.
        </p>
      )}
    </section>
  );
}
