// The drift alert, raised: the latest drift event is acceptance_dropped for the drafter serving
// now, with no acceptance_recovered after it (workers/live_metrics.py check_drift). A drop of a
// drafter since replaced is over: the alert is per drafter.
import type { Deployment } from "../../api/client";
import { RelTime } from "../../components/time";
import { useDeploymentEvents, type DeploymentEvent } from "../deploy/common";

const DRIFT = new Set(["acceptance_dropped", "acceptance_recovered"]);

function raisedAlert(events: DeploymentEvent[], drafter: string): DeploymentEvent | null {
  const last = [...events].reverse().find((e) => DRIFT.has(e.kind));
  if (!last || last.kind !== "acceptance_dropped") return null;
  const about = (last.data as { drafter?: string } | null)?.drafter;
  return about === undefined || about === drafter ? last : null;
}

export function DriftAlert({ deployment }: { deployment: Deployment }) {
  const events = useDeploymentEvents(deployment);
  const alert = events.data ? raisedAlert(events.data, deployment.drafter) : null;
  if (!alert) return null;
  return (
    <div className="live-alert" role="alert">
      <strong>Acceptance dropped.</strong> {alert.message} (<RelTime at={alert.created_at} />). Traffic may have
      drifted from the training data: retrain on the captured traffic, or roll back.
    </div>
  );
}
