// Shared by the deployment pages: statuses, the events request, the client snippets.
import { authedFetch, type Deployment } from "../../api/client";
import { ApiError } from "../../api/errors";

/** A deployment in one of these never changes again (app/services/state.py). */
export const TERMINAL = new Set(["stopped", "failed"]);
/** DELETE moves these on (pending: stopped; starting, ready: stopping). */
export const DELETABLE = new Set(["pending", "starting", "ready"]);

export const isTerminal = (d: Pick<Deployment, "status">) => TERMINAL.has(d.status);

// TODO(schema): GET /api/deployments/{id}/events is being added; switch to the typed client
// (and EventOut-like types from schema.d.ts) once it is in openapi.json.
export interface DeploymentEvent {
  id: number;
  created_at: string;
  kind: string;
  status?: string | null;
  message: string;
  data?: Record<string, unknown> | null;
}

interface EventPage {
  data: DeploymentEvent[];
  has_more: boolean;
  last_id: number | null;
}

/** The deployment's events, oldest first; null when this server has no events route (404). */
export async function fetchDeploymentEvents(id: string): Promise<DeploymentEvent[] | null> {
  const events: DeploymentEvent[] = [];
  let after: number | null = null;
  for (let page = 0; page < 10; page++) {
    const query = new URLSearchParams({ limit: "100" });
    if (after !== null) query.set("after", String(after));
    let body: EventPage;
    try {
      const response = await authedFetch(`/api/deployments/${encodeURIComponent(id)}/events?${query}`);
      body = (await response.json()) as EventPage;
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) return null; // TODO(schema)
      throw error;
    }
    events.push(...body.data);
    if (!body.has_more || body.last_id === null) break;
    after = body.last_id;
  }
  return events;
}

/** The gateway's base URL as a client outside this page would use it. */
export const gatewayBase = () => `${window.location.origin}/v1`;

export function curlSnippet(model: string, base = gatewayBase()): string {
  const body = JSON.stringify({ model, messages: [{ role: "user", content: "Hello!" }], max_tokens: 128 });
  return [
    `curl ${base}/chat/completions \\`,
    `  -H "Authorization: Bearer $SPECDECK_API_KEY" \\`,
    `  -H "Content-Type: application/json" \\`,
    `  -d '${body}'`,
  ].join("\n");
}

export function pythonSnippet(model: string, base = gatewayBase()): string {
  return `import os
from openai import OpenAI

client = OpenAI(base_url=${JSON.stringify(base)}, api_key=os.environ["SPECDECK_API_KEY"])

stream = client.chat.completions.create(
    model=${JSON.stringify(model)},
    messages=[{"role": "user", "content": "Hello!"}],
    max_tokens=128,
    stream=True,
)
for chunk in stream:
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()`;
}

/** A deployment's source in a line of words. */
export function describeSource(source: Deployment["source"]): string {
  const s = source as Record<string, unknown>;
  if (s.kind === "checkpoint") return `checkpoint ${String(s.checkpoint_id)}`;
  return `${String(s.kind ?? "drafter")}: ${String(s.drafter ?? "—")}`;
}

/** {"worker": [0, 1]} as "worker: GPU 0, 1". */
export function describeAllocation(allocation: Deployment["allocation"]): string {
  if (!allocation || Object.keys(allocation).length === 0) return "—";
  return Object.entries(allocation)
    .map(([where, gpus]) => `${where}: GPU ${gpus.length ? gpus.join(", ") : "none"}`)
    .join("; ");
}
