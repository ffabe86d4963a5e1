// A job's events, live: GET /api/jobs/{id}/events/stream read over fetch (EventSource cannot
// send the Authorization header). A dropped connection is opened again after a short backoff
// (1 s, 2 s, 4 s, 8 s, then every 10 s) with Last-Event-ID, so no event is lost or repeated;
// it stops at the stream's `end` (the job has ended) or when the page goes away.
import { useEffect, useState } from "react";
import { authedFetch, type JobEvent } from "../../api/client";
import { ApiError } from "../../api/errors";
import { readSse } from "../../api/sse";

export type Connection = "connecting" | "live" | "reconnecting" | "ended" | "failed";

const MAX_BACKOFF_MS = 10_000;

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

export function useJobEvents(jobId: string) {
  const [events, setEvents] = useState<JobEvent[]>([]);
  const [connection, setConnection] = useState<Connection>("connecting");
  const [error, setError] = useState<unknown>(null);

  useEffect(() => {
    const controller = new AbortController();
    const { signal } = controller;
    let lastId: number | null = null;
    let failures = 0;
    setEvents([]);
    setConnection("connecting");
    setError(null);

    async function follow() {
      while (!signal.aborted) {
        try {
          const headers: Record<string, string> = { Accept: "text/event-stream" };
          if (lastId !== null) headers["Last-Event-ID"] = String(lastId);
          const response = await authedFetch(`/api/jobs/${encodeURIComponent(jobId)}/events/stream`, {
            headers,
            signal,
          });
          if (signal.aborted) return;
          setConnection("live");
          for await (const message of readSse(response, signal)) {
            if (signal.aborted) return;
            if (message.event === "end") {
              setConnection("ended");
              return;
            }
            if (message.event !== "job.event") continue;
            const event = JSON.parse(message.data) as JobEvent;
            if (lastId !== null && event.id <= lastId) continue; // seen already
            lastId = event.id;
            failures = 0;
            setEvents((previous) => [...previous, event]);
          }
        } catch (e) {
          if (signal.aborted) return;
          // No such job, or a key that may not read it: asking again will not change that.
          if (e instanceof ApiError && e.status < 500 && e.status !== 429) {
            setError(e);
            setConnection("failed");
            return;
          }
        }
        if (signal.aborted) return;
        setConnection("reconnecting");
        await sleep(Math.min(1000 * 2 ** failures, MAX_BACKOFF_MS), signal);
        failures += 1;
      }
    }

    follow();
    return () => controller.abort();
  }, [jobId]);

  return { events, connection, error };
}
