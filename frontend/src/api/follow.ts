// A server-sent event stream followed until it ends: GET `path` over fetch, opened again after a
// dropped connection with a short backoff (1 s, 2 s, 4 s, 8 s, then every 10 s) and
// Last-Event-ID (the last `id:` seen), so nothing is lost or repeated. It ends at the stream's
// `end` event, when `onEvent` returns "stop", or when `signal` aborts; it throws the ApiError of
// an answer that asking again will not change (a 4xx other than 429).
import { authedFetch } from "./client";
import { ApiError } from "./errors";
import { readSse, type SseEvent } from "./sse";

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

export interface Follow {
  onEvent: (event: SseEvent) => "stop" | void;
  onLive?: () => void; // each time the stream is open
  onRetry?: () => void; // each time it dropped and is about to be opened again
}

export async function followSse(path: string, signal: AbortSignal, { onEvent, onLive, onRetry }: Follow) {
  let lastId: string | undefined;
  let failures = 0;
  while (!signal.aborted) {
    try {
      const headers: Record<string, string> = { Accept: "text/event-stream" };
      if (lastId !== undefined) headers["Last-Event-ID"] = lastId;
      const response = await authedFetch(path, { headers, signal });
      if (signal.aborted) return;
      onLive?.();
      for await (const message of readSse(response, signal)) {
        if (signal.aborted || message.event === "end") return;
        if (message.id !== undefined) lastId = message.id;
        failures = 0;
        if (onEvent(message) === "stop") return;
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && e.status < 500 && e.status !== 429) throw e;
    }
    if (signal.aborted) return;
    onRetry?.();
    await sleep(Math.min(1000 * 2 ** failures, MAX_BACKOFF_MS), signal);
    failures += 1;
  }
}
