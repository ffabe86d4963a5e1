// A job's, a deployment's or a webhook delivery's status as a coloured badge (the text says it;
// colour only helps).
const TONE: Record<string, string> = {
  succeeded: "good", ready: "good", published: "good",
  failed: "bad", cancelled: "muted", stopped: "muted",
  running: "busy", starting: "busy", stopping: "busy", draining: "busy", publishing: "busy", delivering: "busy",
  queued: "wait", pending: "wait",
  // A bake-off's candidates (CandidateOut.status).
  training: "busy", trained: "busy", evaluated: "good",
};

export function StatusBadge({ status }: { status: string }) {
  return <span className={`badge ${TONE[status] ?? "wait"}`}>{status}</span>;
}

/** A job in one of these states changes no more (app/services/state.py TERMINAL). */
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const isTerminal = (status: string | undefined) => status !== undefined && TERMINAL.has(status);
