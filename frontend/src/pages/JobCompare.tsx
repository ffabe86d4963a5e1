// Two or more jobs side by side (/jobs/compare?ids=job_a,job_b): their settings and served
// figures in one table, and their training curves on shared charts, one colour per job.
import type { ReactNode } from "react";
import { useQueries } from "@tanstack/react-query";
import { Link, useSearchParams } from "react-router-dom";
import { CartesianGrid, Legend, Line, LineChart, Tooltip, XAxis, YAxis } from "recharts";
import { api, must, type Job } from "../api/client";
import { ErrorNote, Loading } from "../components/states";
import { StatusBadge } from "../components/status";
import { Duration } from "../components/time";
import { AXIS, ChartCard, DOT, colorAt, tooltipNumber } from "./job/ChartCard";
import { trainingSeries, type Row, type TrainingSeries } from "./job/metrics";
import { epochOf, evaluationOf, keys, num } from "./job/model";
import { VerdictBadge } from "./job/Verdict";
import { MAX_COMPARED, comparedIds } from "./jobs/compare";
import "./jobs/jobs.css";

const label = (job: Job) => job.name ?? job.id;
const times = (x: number | null | undefined) => (x == null ? "—" : `×${num(x, 2)}`);

/** One chart row per x value, one column per job (its id). */
function merge(jobs: Job[], series: TrainingSeries[], pick: (s: TrainingSeries) => Row[], axis: string, column: string): Row[] {
  const rows = new Map<number, Row>();
  series.forEach((s, i) => {
    for (const point of pick(s)) {
      const x = point[axis];
      if (x == null || point[column] == null) continue;
      let row = rows.get(x);
      if (!row) rows.set(x, (row = { [axis]: x }));
      row[jobs[i].id] = point[column];
    }
  });
  return [...rows.values()].sort((a, b) => a[axis] - b[axis]);
}

function CompareChart({ jobs, data, axis, title, hint }: { jobs: Job[]; data: Row[]; axis: string; title: string; hint?: string }) {
  return (
    <ChartCard label={title} hint={hint} isEmpty={data.length === 0} empty="None of these jobs has recorded it.">
      <LineChart data={data} margin={{ top: 8, right: 12, bottom: 16, left: 0 }}>
        <CartesianGrid stroke="#eef1f5" />
        <XAxis dataKey={axis} type="number" domain={["dataMin", "dataMax"]} allowDecimals={axis === "step"} tick={AXIS} label={{ value: axis, position: "insideBottom", offset: -8, ...AXIS }} />
        <YAxis tick={AXIS} width={48} domain={["auto", "auto"]} />
        <Tooltip formatter={tooltipNumber} labelFormatter={(x) => `${axis} ${x}`} />
        <Legend wrapperStyle={{ fontSize: 12 }} verticalAlign="top" />
        {jobs.map((job, i) => (
          <Line key={job.id} type="monotone" dataKey={job.id} name={label(job)} stroke={colorAt(i)} dot={DOT} connectNulls isAnimationActive={false} />
        ))}
      </LineChart>
    </ChartCard>
  );
}

function FiguresTable({ jobs }: { jobs: Job[] }) {
  const spec = (job: Job) => job.speculator as Record<string, unknown>;
  const evaluation = (job: Job) => evaluationOf(job.evaluation);
  const rows: [string, (job: Job) => ReactNode][] = [
    ["Status", (job) => <StatusBadge status={job.status} />],
    ["Verdict", (job) => (job.verdict ? <VerdictBadge verdict={job.verdict} /> : "—")],
    ["Served acceptance length", (job) => num(evaluation(job)?.mean_acceptance_length, 2)],
    ["Speedup vs no speculation", (job) => times(evaluation(job)?.speedup)],
    ["n-gram acceptance length", (job) => num(evaluation(job)?.ngram_mean_acceptance_length, 2)],
    ["n-gram speedup", (job) => times(evaluation(job)?.ngram_speedup)],
    ["Trainer eal (estimate)", (job) => num(evaluation(job)?.trainer_eal_estimate, 2)],
    ["Evaluated checkpoint", (job) => (evaluation(job) ? `epoch ${epochOf(evaluation(job)?.epoch)}` : "—")],
    ["Verifier", (job) => <span className="mono">{job.verifier}</span>],
    ["Dataset", (job) => <span className="mono">{job.dataset}</span>],
    ["Runtime", (job) => `${job.runtime}, ${job.mode}`],
    ["Block size", (job) => String(spec(job).block_size ?? "—")],
    ["Draft layers", (job) => String(spec(job).num_layers ?? "—")],
    ["Epochs", (job) => String(spec(job).epochs ?? "—")],
    ["Learning rate", (job) => String(spec(job).lr ?? "—")],
    ["Max anchors", (job) => String(spec(job).max_anchors ?? "—")],
    ["Warm start", (job) => job.init_from ?? "—"],
    ["Duration", (job) => <Duration from={job.started_at} to={job.finished_at} />],
  ];
  return (
    <div className="table-wrap card">
      <table aria-label="Jobs side by side" className="compare-table">
        <thead>
          <tr>
            <th />
            {jobs.map((job, i) => (
              <th key={job.id} scope="col">
                <span className="swatch" style={{ background: colorAt(i) }} aria-hidden="true" />
                <Link to={`/jobs/${job.id}`}>{label(job)}</Link>
                {job.name && <div className="mono dim">{job.id}</div>}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows.map(([name, cell]) => (
            <tr key={name}>
              <th scope="row">{name}</th>
              {jobs.map((job) => (
                <td key={job.id}>{cell(job)}</td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export default function JobCompare() {
  const ids = comparedIds(useSearchParams()[0].get("ids"));
  const jobs = useQueries({
    queries: ids.map((id) => ({
      queryKey: keys.job(id),
      queryFn: () => must(api.GET("/api/jobs/{job_id}", { params: { path: { job_id: id } } })),
    })),
  });
  const metrics = useQueries({
    queries: ids.map((id) => ({
      queryKey: [...keys.metrics(id), "all"],
      queryFn: () => must(api.GET("/api/jobs/{job_id}/metrics", { params: { path: { job_id: id } } })),
    })),
  });

  const heading = <h1 className="jobs-title">Compare jobs</h1>;
  if (ids.length < 2)
    return (
      <>
        {heading}
        <p className="state">
          Choose two to {MAX_COMPARED} jobs to compare: tick them in the <Link to="/jobs">jobs list</Link>.
        </p>
      </>
    );
  const failed = [...jobs, ...metrics].find((q) => q.isError);
  if (failed) return <>{heading}<ErrorNote error={failed.error} /></>;
  if (jobs.some((q) => !q.data) || metrics.some((q) => !q.data)) return <>{heading}<Loading what="Loading the jobs" /></>;

  const loaded = jobs.map((q) => q.data!);
  const series = metrics.map((q) => trainingSeries(q.data!.data));
  return (
    <div className="job-compare">
      {heading}
      <p className="hint">
        Served figures are measured by serving each job's chosen checkpoint on held-out prompts; the trainer's
        curves and its eal are estimates.
      </p>
      <FiguresTable jobs={loaded} />
      <div className="grid2 charts">
        <CompareChart jobs={loaded} title="Training loss" axis="step" data={merge(loaded, series, (s) => s.loss, "step", "loss")} />
        <CompareChart
          jobs={loaded}
          title="Acceptance estimate (eal)"
          hint="The trainer's estimate (train/eal), not a served figure."
          axis="step"
          data={merge(loaded, series, (s) => s.eal, "step", "eal")}
        />
        <CompareChart jobs={loaded} title="Validation loss per epoch" axis="epoch" data={merge(loaded, series, (s) => s.validation, "epoch", "loss")} />
        <CompareChart
          jobs={loaded}
          title="Validation eal per epoch (estimate)"
          axis="epoch"
          data={merge(loaded, series, (s) => s.validation, "epoch", "eal")}
        />
      </div>
    </div>
  );
}
