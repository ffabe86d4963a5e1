// The last 500 lines of the job's log and, while "Follow" is on and the job runs, the lines
// written since: one stream (GET /api/jobs/{id}/logs/stream, its events' ids the log's offsets,
// opened again where it stopped after a dropped connection), not a request per batch of lines.
import { useCallback, useEffect, useLayoutEffect, useRef, useState } from "react";
import { followSse } from "../../api/follow";
import { Empty, ErrorNote, Loading } from "../../components/states";

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

interface Tail {
  text: string;
  ended: boolean; // the job has ended: no more lines will come
}

/** The last TAIL lines (tidied), then, while `follow`, what is written after them. */
function useLogTail(jobId: string, follow: boolean) {
  const [tail, setTail] = useState<Tail | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [attempt, setAttempt] = useState(0);
  const retry = useCallback(() => setAttempt((n) => n + 1), []);

  useEffect(() => {
    const controller = new AbortController();
    const { signal } = controller;
    let text = "";
    setError(null);
    followSse(`/api/jobs/${encodeURIComponent(jobId)}/logs/stream?tail=${TAIL}`, signal, {
      onEvent: (message) => {
        if (message.event !== "lines") return;
        text = (text + (JSON.parse(message.data) as string)).split("\n").slice(-TAIL - 1).join("\n");
        setTail({ text: tidyLog(text), ended: false });
        return follow ? undefined : "stop"; // not following: the tail is all that was asked
      },
    }).then(
      () => {
        if (!signal.aborted && follow) setTail((shown) => ({ text: shown?.text ?? "", ended: true }));
        controller.abort(); // a stream left open by "stop"
      },
      (e: unknown) => signal.aborted || setError(e),
    );
    return () => controller.abort();
  }, [jobId, follow, attempt]);
  return { tail, error, retry };
}

export function Logs({ jobId, running }: { jobId: string; running: boolean }) {
  const [follow, setFollow] = useState(running);
  // Following a job that ended reads its end once more, then stops.
  const { tail, error, retry } = useLogTail(jobId, follow && running);
  const pre = useRef<HTMLPreElement>(null);
  const shown = useRef(false); // the first lines shown open at their end too

  useLayoutEffect(() => {
    if (!pre.current) return;
    if (follow || !shown.current) pre.current.scrollTop = pre.current.scrollHeight;
    shown.current = true;
  }, [follow, tail]);

  let body;
  if (error) body = <ErrorNote error={error} retry={retry} />;
  else if (!tail) body = <Loading what="Loading the log" />;
  else if (tail.text === "") body = <Empty>No log lines yet.</Empty>;
  else
    body = (
      <pre ref={pre} className="log" tabIndex={0}>
        {tail.text}
      </pre>
    );

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
      {body}
    </section>
  );
}
