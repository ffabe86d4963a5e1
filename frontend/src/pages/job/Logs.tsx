// The last 500 lines of the job's log; "Follow" asks again every 2 s and keeps the end in view.
import { useLayoutEffect, useRef, useState } from "react";
import { useQuery } from "@tanstack/react-query";
import { api, must } from "../../api/client";
import { QueryState } from "../../components/states";
import { keys } from "./model";

const TAIL = 500;

// A progress bar drawn across a 1000-column terminal: its run of bar characters, shortened.
const LONG_BAR = /([━─═█])\1{40,}/g;

/** Lines without their trailing padding (the trainer pads to its terminal's width), nor the
 * blank lines at the end; of a line redrawn with carriage returns, only its last drawing. */
export function tidyLog(text: string): string {
  const lines = text.split(/\r?\n/).map((line) => {
    const drawn = line.replace(/\s+$/, "");
    const last = drawn.slice(drawn.lastIndexOf("\r") + 1).replace(/\s+$/, "");
    return last.replace(LONG_BAR, (run) => `${run.slice(0, 40)}…`);
  });
  while (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines.join("\n");
}

export function Logs({ jobId, running }: { jobId: string; running: boolean }) {
  const [follow, setFollow] = useState(running);
  const logs = useQuery({
    queryKey: keys.logs(jobId),
    queryFn: async () =>
      tidyLog(
        await must(
          api.GET("/api/jobs/{job_id}/logs", {
            params: { path: { job_id: jobId }, query: { tail: TAIL } },
            parseAs: "text",
          }),
        ),
      ),
    refetchInterval: follow ? 2000 : false,
  });
  const pre = useRef<HTMLPreElement>(null);
  const shown = useRef(false); // the first lines shown open at their end too

  useLayoutEffect(() => {
    if (!pre.current) return;
    if (follow || !shown.current) pre.current.scrollTop = pre.current.scrollHeight;
    shown.current = true;
  }, [follow, logs.data]);

  return (
    <section className="card logs" aria-label="Logs">
      <div className="section-head">
        <h2>Logs</h2>
        <span className="dim">last {TAIL} lines</span>
        <label className="check">
          <input type="checkbox" checked={follow} onChange={(e) => setFollow(e.target.checked)} />
          Follow
        </label>
      </div>
      <QueryState query={logs} what="Loading the log" isEmpty={(text) => text === ""} empty="No log lines yet.">
        {(text) => (
          <pre ref={pre} className="log" tabIndex={0}>
            {text}
          </pre>
        )}
      </QueryState>
    </section>
  );
}
