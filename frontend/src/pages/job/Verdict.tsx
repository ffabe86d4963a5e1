// A drafter that does not pay off (the API's `verdict` of a job or checkpoint: slower than no
// speculation, or no better than n-gram drafting), said where a user decides what to serve:
// the job's header, its row in the jobs list, its checkpoints, and the deploy form.
import type { Verdict } from "../../api/client";

const tone = (verdict: Verdict) => (verdict.code === "slower_than_no_speculation" ? "bad" : "warn");

/** The verdict in a sentence, in a warning box. */
export function VerdictNote({ verdict }: { verdict: Verdict }) {
  return (
    <div className={`state ${tone(verdict) === "bad" ? "error" : "warn"}`} role="status" data-testid="verdict">
      {verdict.message}
    </div>
  );
}

/** The verdict in two or three words, for a table cell. */
export function VerdictBadge({ verdict }: { verdict: Verdict }) {
  return (
    <span className={`badge ${tone(verdict)}`} title={verdict.message} data-testid="verdict-badge">
      {verdict.summary}
    </span>
  );
}
