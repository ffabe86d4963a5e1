// The deployment's event timeline, newest first: status changes, processes, promotion steps,
// drift alerts.
import type { Deployment } from "../../api/client";
import { QueryState } from "../../components/states";
import { StatusBadge } from "../../components/status";
import { RelTime } from "../../components/time";
import { useDeploymentEvents } from "../deploy/common";

export function Events({ deployment }: { deployment: Deployment }) {
  const events = useDeploymentEvents(deployment);
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
