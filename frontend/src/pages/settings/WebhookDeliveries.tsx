// A webhook's delivery log: each delivery (its event, status, attempts, when it is sent next)
// with its attempts (the receiver's HTTP status or the network error, and how long it took).
// It refreshes while a delivery on the page is still to be sent, as the jobs list does for
// running jobs.
import { useQuery } from "@tanstack/react-query";
import { api, must, type Webhook, type WebhookAttempt, type WebhookDelivery } from "../../api/client";
import { Pager, useCursor } from "../../components/pager";
import { QueryState } from "../../components/states";
import { StatusBadge } from "../../components/status";
import { RelTime } from "../../components/time";

/** Deliveries in these states change still (app/schemas/webhooks.py WebhookDeliveryOut.status). */
const OPEN = new Set<WebhookDelivery["status"]>(["pending", "delivering"]);

function AttemptResult({ attempt }: { attempt: WebhookAttempt }) {
  if (attempt.status_code !== null) {
    const ok = attempt.status_code >= 200 && attempt.status_code < 300;
    return <span className={`badge ${ok ? "good" : "bad"}`}>HTTP {attempt.status_code}</span>;
  }
  if (attempt.error) return <span className="attempt-error">{attempt.error}</span>;
  return <span className="dim">sending…</span>;
}

function Attempts({ delivery }: { delivery: WebhookDelivery }) {
  if (delivery.attempts.length === 0) return <p className="hint">Not sent yet.</p>;
  return (
    <table className="attempts" aria-label={`Attempts of ${delivery.id}`}>
      <thead>
        <tr>
          <th className="num">#</th>
          <th>Started</th>
          <th>Result</th>
          <th className="num">Took</th>
        </tr>
      </thead>
      <tbody>
        {delivery.attempts.map((attempt, i) => (
          <tr key={i}>
            <td className="num">{i + 1}</td>
            <td>
              <RelTime at={attempt.started_at} />
            </td>
            <td>
              <AttemptResult attempt={attempt} />
            </td>
            <td className="num">{attempt.duration_ms === null ? "—" : `${attempt.duration_ms} ms`}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function DeliveryItem({ delivery }: { delivery: WebhookDelivery }) {
  const count = delivery.attempt_count;
  return (
    <li aria-label={`Delivery ${delivery.id}`}>
      <div className="delivery-head">
        <code className="event">{delivery.event_type}</code>
        <StatusBadge status={delivery.status} />
        <span className="dim">
          {count} {count === 1 ? "attempt" : "attempts"}
        </span>
        {delivery.next_attempt_at && (
          <span className="dim">
            next <RelTime at={delivery.next_attempt_at} />
          </span>
        )}
        <span className="dim">
          created <RelTime at={delivery.created_at} />
        </span>
        <span className="mono dim hide-narrow">{delivery.id}</span>
      </div>
      <Attempts delivery={delivery} />
    </li>
  );
}

export default function WebhookDeliveries({ webhook }: { webhook: Webhook }) {
  const cursor = useCursor();
  const deliveries = useQuery({
    queryKey: ["webhook-deliveries", webhook.id, cursor.after],
    queryFn: () =>
      must(
        api.GET("/api/webhooks/{webhook_id}/deliveries", {
          params: { path: { webhook_id: webhook.id }, query: { limit: 10, after: cursor.after } },
        }),
      ),
    refetchInterval: (query) => (query.state.data?.data.some((d) => OPEN.has(d.status)) ? 2000 : false),
  });
  return (
    <div className="deliveries" role="region" aria-label={`Deliveries of ${webhook.url}`}>
      <h3>Deliveries</h3>
      <QueryState
        query={deliveries}
        what="Loading deliveries"
        isEmpty={(page) => page.data.length === 0}
        empty={<p>No deliveries yet. Send a test event to see one here.</p>}
      >
        {(page) => (
          <>
            <ol className="deliveries" aria-label="Deliveries">
              {page.data.map((d) => (
                <DeliveryItem key={d.id} delivery={d} />
              ))}
            </ol>
            <Pager cursor={cursor} hasMore={page.has_more} lastId={page.last_id} />
          </>
        )}
      </QueryState>
    </div>
  );
}
