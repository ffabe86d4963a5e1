// Shared by the deployment pages: statuses, the events request, the client snippets.
import { useQuery } from "@tanstack/react-query";
import { api, must, type Deployment, type Schemas } from "../../api/client";
import { keys } from "../deployment/keys";

/** A deployment in one of these never changes again (app/services/state.py). */
export const TERMINAL = new Set(["stopped", "failed"]);
/** DELETE moves these on (pending: stopped; starting, ready: stopping). */
export const DELETABLE = new Set(["pending", "starting", "ready"]);

export const isTerminal = (d: Pick<Deployment, "status">) => TERMINAL.has(d.status);

export type DeploymentEvent = Schemas["DeploymentEventOut"];

/** The deployment's events, oldest first (up to 1000). */
export async function fetchDeploymentEvents(id: string): Promise<DeploymentEvent[]> {
  const events: DeploymentEvent[] = [];
  let after: number | undefined;
  for (let page = 0; page < 10; page++) {
    const body = await must(
      api.GET("/api/deployments/{deployment_id}/events", {
        params: { path: { deployment_id: id }, query: { limit: 100, after } },
      }),
    );
    events.push(...body.data);
    if (!body.has_more || body.last_id == null) break;
    after = Number(body.last_id);
  }
  return events;
}

/** The deployment's events, polled every 3 s until it ends (the timeline and the drift alert). */
export function useDeploymentEvents(deployment: Deployment) {
  return useQuery({
    queryKey: keys.events(deployment.id),
    queryFn: () => fetchDeploymentEvents(deployment.id),
    refetchInterval: isTerminal(deployment) ? false : 3000,
  });
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

// The local runtime's units (app/services/scheduling.py Need): slots of a CPU worker, not GPUs.
const CPU_SLOTS: Record<string, string> = { serving: "serving slot", slot: "training slot" };

/** {"verifier": [0, 1]} as "verifier: GPU 0, 1"; a CPU worker's {"serving": [0]} as "serving slot
 * 0 (CPU)". */
export function describeAllocation(allocation: Deployment["allocation"]): string {
  if (!allocation || Object.keys(allocation).length === 0) return "—";
  return Object.entries(allocation)
    .map(([where, units]) =>
      CPU_SLOTS[where]
        ? `${CPU_SLOTS[where]} ${units.join(", ")} (CPU)`
        : `${where}: GPU ${units.length ? units.join(", ") : "none"}`,
    )
    .join("; ");
}
