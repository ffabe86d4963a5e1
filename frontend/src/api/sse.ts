// Server-sent events over fetch (EventSource cannot send an Authorization header, and the key
// must not go in the URL). Yields each event; the caller reconnects with the last id.
export interface SseEvent {
  id?: string;
  event: string;
  data: string;
}

export async function* readSse(response: Response, signal?: AbortSignal): AsyncGenerator<SseEvent> {
  if (!response.body) return;
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let current: { id?: string; event?: string; data: string[] } = { data: [] };
  try {
    while (!signal?.aborted) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let newline: number;
      while ((newline = buffer.search(/\r?\n/)) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer[newline] === "\r" ? 2 : 1));
        if (line === "") {
          if (current.data.length > 0 || current.event) {
            yield { id: current.id, event: current.event ?? "message", data: current.data.join("\n") };
          }
          current = { data: [] };
          continue;
        }
        if (line.startsWith(":")) continue; // a comment (keep-alive)
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value_ = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "data") current.data.push(value_);
        else if (field === "event") current.event = value_;
        else if (field === "id") current.id = value_;
      }
    }
  } finally {
    reader.releaseLock();
  }
}
