// A deployment's live acceptance series (GET /api/deployments/{id}/metrics), fetched
// incrementally: the first request asks for the last HISTORY_MS, every poll after it only for
// the points after the last one held (`after`), so a long-lived page never downloads the whole
// series again. Each answer also carries the window summary, which is replaced every time.
import { useQuery, useQueryClient } from "@tanstack/react-query";
import { api, must, type Deployment, type LivePoint, type LiveWindow } from "../../api/client";
import { isTerminal } from "../deploy/common";
import { keys } from "./keys";

/** What the chart shows: the last six hours (the worker scrapes every 15 s by default). */
export const HISTORY_MS = 6 * 3600_000;
/** How often a serving deployment's new points are asked for. */
const POLL_MS = 5000;
const PAGE = 1000; // the API's largest page
const PAGES_PER_POLL = 5; // beyond: the next poll goes on from there

export interface LiveSeries {
  points: LivePoint[];
  lastId: number | null;
  window: LiveWindow;
}

async function fetchNewPoints(deploymentId: string, held: LiveSeries | undefined): Promise<LiveSeries> {
  let after = held?.lastId ?? undefined;
  // Until a first point is held, only the recent ones: never the whole history.
  const since = after === undefined ? new Date(Date.now() - HISTORY_MS).toISOString() : undefined;
  const fresh: LivePoint[] = [];
  let window = held?.window;
  for (let page = 0; page < PAGES_PER_POLL; page++) {
    const body = await must(
      api.GET("/api/deployments/{deployment_id}/metrics", {
        params: { path: { deployment_id: deploymentId }, query: { limit: PAGE, after, since } },
      }),
    );
    fresh.push(...body.data);
    window = body.window;
    if (body.last_id != null) after = Number(body.last_id);
    if (!body.has_more) break;
  }
  const oldest = Date.now() - HISTORY_MS;
  const points = [...(held?.points ?? []), ...fresh].filter((p) => Date.parse(p.created_at) >= oldest);
  return { points, lastId: after ?? null, window: window! };
}

/** The series, polled every POLL_MS while the deployment serves. */
export function useLiveSeries(deployment: Deployment) {
  const queryClient = useQueryClient();
  const key = keys.live(deployment.id);
  return useQuery({
    queryKey: key,
    queryFn: () => fetchNewPoints(deployment.id, queryClient.getQueryData<LiveSeries>(key)),
    refetchInterval: isTerminal(deployment) ? false : POLL_MS,
  });
}

/** One drafter's run of consecutive points of one replica: a promotion (or a rollback) starts
 * a new one, and each replica's engine has lines of its own. */
export interface Run {
  key: string; // the checkpoint id, or the drafter for one that is not a checkpoint
  replica: number; // whose engine
  first: boolean; // the first run of this key and replica (the one the legend names)
  dataKey: string; // its column in the rows: "r0", "r1", ...
}

/** The chart's rows: the time and the acceptance length in the column of the run it belongs to. */
export type Row = { t: number } & Record<string, number>;

const drafterOf = (p: Pick<LivePoint, "checkpoint_id" | "drafter">) => p.checkpoint_id ?? p.drafter;

/** The points with an acceptance length (some intervals drafted nothing), split into runs. */
export function runsOf(points: LivePoint[]): { runs: Run[]; rows: Row[] } {
  const runs: Run[] = [];
  const rows: Row[] = [];
  const current = new Map<number, Run>(); // each replica's latest run
  const seen = new Set<string>();
  for (const p of points) {
    if (p.acceptance_length == null) continue;
    const key = drafterOf(p);
    let run = current.get(p.replica);
    if (!run || run.key !== key) {
      const id = `${p.replica} ${key}`;
      run = { key, replica: p.replica, first: !seen.has(id), dataKey: `r${runs.length}` };
      seen.add(id);
      runs.push(run);
      current.set(p.replica, run);
    }
    rows.push({ t: Date.parse(p.created_at), [run.dataKey]: p.acceptance_length } as Row);
  }
  return { runs, rows };
}
