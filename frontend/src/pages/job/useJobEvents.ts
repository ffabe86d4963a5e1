// A job's events, live: GET /api/jobs/{id}/events/stream, followed until the stream's `end` (the
// job has ended) or the page goes away; a dropped connection is opened again with Last-Event-ID,
// so no event is lost or repeated (api/follow.ts).
import { useEffect, useState } from "react";
import type { JobEvent } from "../../api/client";
import { followSse } from "../../api/follow";

export type Connection = "connecting" | "live" | "reconnecting" | "ended" | "failed";

export function useJobEvents(jobId: string) {
  const [events, setEvents] = useState<JobEvent[]>([]);
  const [connection, setConnection] = useState<Connection>("connecting");
  const [error, setError] = useState<unknown>(null);

  useEffect(() => {
    const controller = new AbortController();
    const { signal } = controller;
    let lastId: number | null = null;
    setEvents([]);
    setConnection("connecting");
    setError(null);

    followSse(`/api/jobs/${encodeURIComponent(jobId)}/events/stream`, signal, {
      onLive: () => setConnection("live"),
      onRetry: () => setConnection("reconnecting"),
      onEvent: (message) => {
        if (message.event !== "job.event") return;
        const event = JSON.parse(message.data) as JobEvent;
        if (lastId !== null && event.id <= lastId) return; // seen already
        lastId = event.id;
        setEvents((previous) => [...previous, event]);
      },
    }).then(
      () => signal.aborted || setConnection("ended"),
      (e: unknown) => {
        // No such job, or a key that may not read it: asking again will not change that.
        setError(e);
        setConnection("failed");
      },
    );
    return () => controller.abort();
  }, [jobId]);

  return { events, connection, error };
}
