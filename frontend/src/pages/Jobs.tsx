import { useEffect, useState } from "react";
import { Link, useNavigate, useSearchParams } from "react-router-dom";
import { useQuery } from "@tanstack/react-query";
import { api, must, type Job, type Schemas } from "../api/client";
import { Pager, useCursor } from "../components/pager";
import { QueryState } from "../components/states";
import { StatusBadge, isTerminal } from "../components/status";
import { Duration, RelTime } from "../components/time";
import { MAX_COMPARED } from "./jobs/compare";
import { progressOf, stageProgressOf } from "./job/model";
import { VerdictBadge } from "./job/Verdict";
import "./jobs/jobs.css";

type JobStatus = Schemas["JobStatus"];

// Every value of the API's JobStatus (a Record: the compiler notices one missing).
const STATUSES: Record<JobStatus, true> = {
  queued: true,
  running: true,
  succeeded: true,
  failed: true,
  cancelling: true,
  cancelled: true,
};

/** What the served AL is of: a bake-off's winner and its kind (or how many candidates it has),
 * a plain job's kind. */
function Drafter({ job }: { job: Job }) {
  if (job.candidates.length > 1) {
    const winner = job.candidates.find((c) => c.winner);
    return (
      <div className="dim job-kind" data-testid="job-winner-kind">
        {winner ? `winner ${winner.name} · ${winner.kind}` : `bake-off of ${job.candidates.length}`}
      </div>
    );
  }
  const kind = job.candidates[0]?.kind ?? String((job.speculator as { type?: unknown }).type ?? "dflash");
  return <div className="dim job-kind">{kind}</div>;
}

type SortKey = "speedup" | "al";
const SORTED_BY: Record<SortKey, (job: Job) => number | null> = {
  speedup: (job) => (typeof job.evaluation?.speedup === "number" ? job.evaluation.speedup : null),
  al: (job) => job.served_acceptance_length ?? null,
};

function speedupText(job: Job): string {
  const speedup = SORTED_BY.speedup(job);
  if (speedup === null) return "—";
  const spread = job.evaluation?.speedup_spread;
  return `×${speedup.toFixed(2)}${typeof spread === "number" && spread > 0 ? ` ±${spread.toFixed(2)}` : ""}`;
}

/** The page's jobs by `sort` ("speedup", "-speedup": ascending), those not measured last. */
function sortJobs(jobs: Job[], sort: string): Job[] {
  const key = sort.replace(/^-/, "") as SortKey;
  if (!(key in SORTED_BY)) return jobs;
  const sign = sort.startsWith("-") ? 1 : -1;
  const value = SORTED_BY[key];
  return [...jobs].sort((a, b) => {
    const x = value(a);
    const y = value(b);
    if (x === null || y === null) return x === y ? 0 : x === null ? 1 : -1;
    return sign * (x - y);
  });
}

/** A column header that sorts the page: highest first, then lowest first, then as listed. */
function SortHeader({ label, title, sortKey, sort, onSort, className = "num" }: {
  label: string;
  title: string;
  sortKey: SortKey;
  sort: string;
  onSort: (sort: string) => void;
  className?: string;
}) {
  const state = sort === sortKey ? "descending" : sort === `-${sortKey}` ? "ascending" : "none";
  const next = state === "none" ? sortKey : state === "descending" ? `-${sortKey}` : "";
  return (
    <th className={className} aria-sort={state}>
      <button type="button" className="link sort" onClick={() => onSort(next)} title={`${title}: sort this page`}>
        <abbr title={title}>{label}</abbr>
        <span aria-hidden="true">{state === "descending" ? " ↓" : state === "ascending" ? " ↑" : " ↕"}</span>
      </button>
    </th>
  );
}

function JobRow({ job, selected, onSelect }: { job: Job; selected: boolean; onSelect: (on: boolean) => void }) {
  const progress = stageProgressOf(job)?.text ?? progressOf(job);
  return (
    <tr>
      <td className="pick">
        <input
          type="checkbox"
          checked={selected}
          aria-label={`Compare ${job.name ?? job.id}`}
          onChange={(e) => onSelect(e.target.checked)}
        />
      </td>
      <td>
        {job.name && <div className="job-name">{job.name}</div>}
        <Link to={`/jobs/${job.id}`} className="mono job-id">
          {job.id}
        </Link>
        <div className="dim job-verifier">{job.verifier}</div>
      </td>
      <td>
        <StatusBadge status={job.status} />
        {job.stage && <div className="job-stage">{job.stage}</div>}
        {progress && <div className="dim job-stage">{progress}</div>}
      </td>
      <td className="num" title="Served speedup: output tokens/s against the verifier alone">
        <span data-testid="job-speedup">{speedupText(job)}</span>
        <Drafter job={job} />
        {job.verdict && (
          <div>
            <VerdictBadge verdict={job.verdict} />
          </div>
        )}
      </td>
      <td className="num hide-narrow" title="Served acceptance length (tokens per verifier pass)">
        {job.served_acceptance_length != null ? job.served_acceptance_length.toFixed(2) : "—"}
      </td>
      <td className="hide-narrow">
        <RelTime at={job.created_at} />
      </td>
      <td className="hide-narrow">
        <Duration from={job.started_at} to={job.finished_at} />
      </td>
    </tr>
  );
}

export default function Jobs() {
  // The filters live in the URL (?status=running&name=chat): a reload or a shared link keeps them.
  const [params, setParams] = useSearchParams();
  const wanted = params.get("status") ?? "";
  const status: JobStatus | "" = wanted in STATUSES ? (wanted as JobStatus) : "";
  const name = params.get("name") ?? "";
  const sort = params.get("sort") ?? "";
  const [typed, setTyped] = useState(name);
  const cursor = useCursor();
  const navigate = useNavigate();
  // The jobs ticked for comparison, in the order they were ticked (kept across pages).
  const [picked, setPicked] = useState<string[]>([]);
  const pick = (id: string, on: boolean) =>
    setPicked((ids) => (on ? [...ids.filter((x) => x !== id), id].slice(-MAX_COMPARED) : ids.filter((x) => x !== id)));

  function setFilter(key: "status" | "name" | "sort", value: string) {
    const next = new URLSearchParams(params);
    if (value) next.set(key, value);
    else next.delete(key);
    setParams(next, { replace: true });
    if (key !== "sort") cursor.reset(); // a sort orders the page shown
  }

  // The box follows the URL when it changes by navigation (back, a link to /jobs).
  useEffect(() => {
    setTyped((t) => (t.trim() === name ? t : name));
  }, [name]);

  // The name filter follows what is typed, once typing pauses.
  useEffect(() => {
    if (typed.trim() === name) return;
    const timer = setTimeout(() => setFilter("name", typed.trim()), 300);
    return () => clearTimeout(timer);
  });

  const jobs = useQuery({
    queryKey: ["jobs", status, name, cursor.after],
    queryFn: () =>
      must(
        api.GET("/api/jobs", {
          params: { query: { limit: 20, after: cursor.after, status: status || undefined, name: name || undefined } },
        }),
      ),
    // Follow the jobs on the page while any of them can still change.
    refetchInterval: (query) => (query.state.data?.data.some((j) => !isTerminal(j.status)) ? 3000 : false),
  });

  return (
    <>
      <div className="toolbar">
        <h1 className="jobs-title">Jobs</h1>
        <span className="spacer" />
        <div className="field jobs-filter">
          <label htmlFor="jobs-name">Name</label>
          <input
            id="jobs-name"
            type="search"
            value={typed}
            maxLength={100}
            placeholder="any"
            onChange={(e) => setTyped(e.target.value)}
          />
        </div>
        <div className="field jobs-filter">
          <label htmlFor="jobs-status">Status</label>
          <select id="jobs-status" value={status} onChange={(e) => setFilter("status", e.target.value)}>
            <option value="">All</option>
            {(Object.keys(STATUSES) as JobStatus[]).map((s) => (
              <option key={s} value={s}>
                {s}
              </option>
            ))}
          </select>
        </div>
        <button
          type="button"
          disabled={picked.length < 2}
          title={picked.length < 2 ? `Tick two to ${MAX_COMPARED} jobs to compare them` : undefined}
          onClick={() => navigate(`/jobs/compare?ids=${picked.join(",")}`)}
        >
          Compare{picked.length > 0 && ` (${picked.length})`}
        </button>
        {picked.length === 1 && <span className="hint">Tick one more job to compare.</span>}
        <Link to="/jobs/new" className="button primary">
          New job
        </Link>
      </div>
      <QueryState
        query={jobs}
        what="Loading jobs"
        isEmpty={(page) => page.data.length === 0}
        empty={
          status || name ? (
            <p>
              No {status ? `${status} ` : ""}jobs{name && <> named like “{name}”</>}.
            </p>
          ) : (
            <p>
              No jobs yet. <Link to="/jobs/new">Create a job</Link> to train a speculative-decoding drafter.
            </p>
          )
        }
      >
        {(page) => (
          <>
            <div className="table-wrap">
              <table aria-label="Jobs">
                <thead>
                  <tr>
                    <th className="pick">
                      <span className="sr-only">Compare</span>
                    </th>
                    <th>Job</th>
                    <th>Status, stage</th>
                    <SortHeader label="Speedup" title="Served speedup" sortKey="speedup" sort={sort}
                      onSort={(v) => setFilter("sort", v)} />
                    <SortHeader label="Served AL" title="Served acceptance length" sortKey="al" sort={sort}
                      onSort={(v) => setFilter("sort", v)} className="num hide-narrow" />
                    <th className="hide-narrow">Created</th>
                    <th className="hide-narrow">Duration</th>
                  </tr>
                </thead>
                <tbody>
                  {sortJobs(page.data, sort).map((job) => (
                    <JobRow key={job.id} job={job} selected={picked.includes(job.id)} onSelect={(on) => pick(job.id, on)} />
                  ))}
                </tbody>
              </table>
            </div>
            <Pager cursor={cursor} hasMore={page.has_more} lastId={page.last_id} />
          </>
        )}
      </QueryState>
    </>
  );
}
