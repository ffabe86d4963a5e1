// The job's events as they happen, oldest first (the newest at the bottom, kept in view).
import { useLayoutEffect, useRef } from "react";
import type { JobEvent } from "../../api/client";
import { Empty, ErrorNote, Loading } from "../../components/states";
import { RelTime } from "../../components/time";
import type { Connection } from "./useJobEvents";

const CONNECTION_TEXT: Record<Connection, string> = {
  connecting: "connecting…",
  live: "live",
  reconnecting: "reconnecting…",
  ended: "ended",
  failed: "not connected",
};

const KIND_TONE: Record<string, string> = {
  status: "busy",
  evaluated: "good",
  checkpoint: "good",
  candidate: "busy", // a bake-off candidate's status change
  error: "bad",
  failed: "bad",
};

export function Timeline({
  events,
  connection,
  error,
}: {
  events: JobEvent[];
  connection: Connection;
  error: unknown;
}) {
  const list = useRef<HTMLOListElement>(null);
  const pinned = useRef(true); // follow the newest event unless the reader scrolled up

  useLayoutEffect(() => {
    const el = list.current;
    if (el && pinned.current) el.scrollTop = el.scrollHeight;
  }, [events.length]);

  function onScroll() {
    const el = list.current;
    if (el) pinned.current = el.scrollHeight - el.scrollTop - el.clientHeight < 24;
  }

  let body;
  if (events.length === 0) {
    if (connection === "failed") body = <ErrorNote error={error} />;
    else if (connection === "ended") body = <Empty>No events.</Empty>;
    else body = <Loading what="Waiting for events" />;
  }

  return (
    <section className="card timeline" aria-labelledby="timeline-title">
      <div className="section-head">
        <h2 id="timeline-title">Events</h2>
        <span className={`conn conn-${connection}`} role="status">
          {CONNECTION_TEXT[connection]}
        </span>
      </div>
      {body}
      <ol ref={list} onScroll={onScroll} aria-label="Event timeline" className="events" tabIndex={0}>
        {events.map((event) => (
          <li key={event.id}>
            <div className="event-meta">
              <span className={`badge ${KIND_TONE[event.kind] ?? "muted"}`}>{event.kind}</span>
              {event.stage && <span className="mono dim">{event.stage}</span>}
              <span className="dim event-time">
                <RelTime at={event.created_at} />
              </span>
            </div>
            <div className="event-message">{event.message}</div>
          </li>
        ))}
      </ol>
    </section>
  );
}
