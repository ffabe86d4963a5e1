// Jobs side by side (/jobs/compare?ids=job_a,job_b): their settings and served figures in one
// table, and their training curves on shared charts, one colour each. A bake-off is compared by
// its candidates (each one a column and a line), so one bake-off alone (?ids=job_a) shows its
// candidates side by side.
import type { ReactNode } from "react";
import { useQueries } from "@tanstack/react-query";
import { Link, useSearchParams } from "react-router-dom";
import { CartesianGrid, Legend, Line, LineChart, Tooltip, XAxis, YAxis } from "recharts";
import { api, must, type Job, type Schemas } from "../api/client";
import { ErrorNote, Loading } from "../components/states";
import { StatusBadge } from "../components/status";
import { Duration, duration } from "../components/time";
import { AXIS, ChartCard, DOT, colorAt, tooltipNumber } from "./job/ChartCard";
import { candidateSeries, trainingSeries, type Row, type TrainingSeries } from "./job/metrics";
import { costOf, epochOf, evaluationOf, isBakeoff, isBlockKind, keys, num, type Candidate } from "./job/model";
import { VerdictBadge } from "./job/Verdict";
import { MAX_COMPARED, comparedIds } from "./jobs/compare";
import "./jobs/jobs.css";

type Metric = Schemas["MetricOut"];

/** What is compared: a job (of one drafter), or one candidate of a bake-off. */
interface Entry {
  key: string; // the chart column
  job: Job;
  candidate: Candidate | null;
  series: TrainingSeries;
}

const jobLabel = (job: Job) => job.name ?? job.id;
const times = (x: number | null | undefined) => (x == null ? "—" : `×${num(x, 2)}`);

/** Each job's entries: a bake-off's candidates, each with its own curves; else the job. */
function entriesOf(jobs: Job[], metrics: Metric[][]): Entry[] {
  return jobs.flatMap((job, i): Entry[] =>
    isBakeoff(job)
      ? candidateSeries(metrics[i], job.candidates).map((c) => ({
          key: `${job.id}:${c.index}`,
          job,
          candidate: job.candidates.find((x) => x.index === c.index)!,
          series: c.series,
        }))
      : [{ key: job.id, job, candidate: null, series: trainingSeries(metrics[i]) }],
  );
}

const entryLabel = (e: Entry, many: boolean) =>
  e.candidate ? (many ? `${e.candidate.name} (${jobLabel(e.job)})` : e.candidate.name) : jobLabel(e.job);

/** One chart row per x value, one column per entry (its key). */
function merge(entries: Entry[], pick: (s: TrainingSeries) => Row[], axis: string, column: string): Row[] {
  const rows = new Map<number, Row>();
  for (const e of entries) {
    for (const point of pick(e.series)) {
      const x = point[axis];
      if (x == null || point[column] == null) continue;
      let row = rows.get(x);
      if (!row) rows.set(x, (row = { [axis]: x }));
      row[e.key] = point[column];
    }
  }
  return [...rows.values()].sort((a, b) => a[axis] - b[axis]);
}

function CompareChart({ entries, many, data, axis, title, hint }: { entries: Entry[]; many: boolean; data: Row[]; axis: string; title: string; hint?: string }) {
  return (
    <ChartCard label={title} hint={hint} isEmpty={data.length === 0} empty="None of these has recorded it.">
      <LineChart data={data} margin={{ top: 8, right: 12, bottom: 16, left: 0 }}>
        <CartesianGrid stroke="#eef1f5" />
        <XAxis dataKey={axis} type="number" domain={["dataMin", "dataMax"]} allowDecimals={axis === "step"} tick={AXIS} label={{ value: axis, position: "insideBottom", offset: -8, ...AXIS }} />
        <YAxis tick={AXIS} width={48} domain={["auto", "auto"]} />
        <Tooltip formatter={tooltipNumber} labelFormatter={(x) => `${axis} ${x}`} />
        <Legend wrapperStyle={{ fontSize: 12 }} verticalAlign="top" />
        {entries.map((e, i) => (
          <Line key={e.key} type="monotone" dataKey={e.key} name={entryLabel(e, many)} stroke={colorAt(i)} dot={DOT} connectNulls isAnimationActive={false} />
        ))}
      </LineChart>
    </ChartCard>
  );
}

function FiguresTable({ entries, many }: { entries: Entry[]; many: boolean }) {
  // A candidate's own figures; a job's, its evaluation's (a bake-off's: its winner's headline).
  const evaluation = (e: Entry) => evaluationOf(e.candidate ? e.candidate.evaluation : e.job.evaluation);
  const settings = (e: Entry) => (e.candidate ? e.candidate.settings : (e.job.speculator as Record<string, unknown>));
  const setting = (name: string) => (e: Entry) => String(settings(e)[name] ?? "—");
  const kind = (e: Entry) => e.candidate?.kind ?? String(settings(e).type ?? "dflash");
  const headline = (e: Entry) => evaluationOf(e.job.evaluation);
  // The job's verdict is its headline's: a plain job's, or the bake-off candidate it names.
  const verdictOf = (e: Entry) => (!e.candidate || headline(e)?.candidate === e.candidate.name ? e.job.verdict : null);
  const rows: [string, (e: Entry) => ReactNode][] = [
    ["Status", (e) => <StatusBadge status={e.candidate?.status ?? e.job.status} />],
    ...(entries.some((e) => e.candidate)
      ? ([
          [
            "Rank",
            (e) =>
              e.candidate?.rank != null ? (
                <>
                  #{e.candidate.rank}
                  {e.candidate.winner && <strong> (winner)</strong>}
                  {e.candidate.tied_with.length > 0 && <div className="dim small">tied with {e.candidate.tied_with.join(", ")}</div>}
                </>
              ) : (
                "—"
              ),
          ],
        ] as [string, (e: Entry) => ReactNode][])
      : []),
    ["Verdict", (e) => { const v = verdictOf(e); return v ? <VerdictBadge verdict={v} /> : "—"; }],
    ["Served acceptance length", (e) => num(evaluation(e)?.mean_acceptance_length, 2)],
    [
      "Speedup vs no speculation",
      (e) => {
        const ev = evaluation(e);
        if (ev?.speedup == null) return "—";
        return ev.speedup_spread != null && (ev.rounds ?? 1) > 1 ? `${times(ev.speedup)} ±${num(ev.speedup_spread, 2)}` : times(ev.speedup);
      },
    ],
    ["Lossless", (e) => { const ev = evaluation(e); return ev?.lossless == null ? "—" : ev.lossless ? `yes (${ev.outputs_identical_to_baseline ?? "?"})` : `no (${ev.outputs_identical_to_baseline ?? "?"} identical)`; }],
    ["n-gram acceptance length", (e) => num(evaluation(e)?.ngram_mean_acceptance_length, 2)],
    ["n-gram speedup", (e) => times(evaluation(e)?.ngram_speedup)],
    ["Trainer eal (estimate)", (e) => num(evaluation(e)?.trainer_eal_estimate, 2)],
    ["Evaluated checkpoint", (e) => (evaluation(e) ? `epoch ${epochOf(evaluation(e)?.epoch)}` : "—")],
    [
      "Training cost",
      (e) => {
        // A job of one drafter: its one candidate's.
        const candidate = e.candidate ?? e.job.candidates[0];
        const cost = candidate ? costOf(candidate, e.job.runtime) : null;
        return cost ? `${duration(cost.seconds)} ${cost.unit.replace(" s", "")}` : "—";
      },
    ],
    ["Kind", kind],
    ["Verifier", (e) => <span className="mono">{e.job.verifier}</span>],
    ["Dataset", (e) => <span className="mono">{e.job.dataset}</span>],
    ["Runtime", (e) => `${e.job.runtime}, ${e.job.mode}`],
    ["Block size", (e) => (isBlockKind(kind(e)) ? setting("block_size")(e) : "—")],
    ["Draft layers", setting("num_layers")],
    ["Epochs", setting("epochs")],
    ["Learning rate", setting("lr")],
    ["Max anchors", (e) => (isBlockKind(kind(e)) ? setting("max_anchors")(e) : "—")],
    ["Warm start", (e) => e.job.init_from ?? "—"],
    ["Duration", (e) => <Duration from={e.job.started_at} to={e.job.finished_at} />],
  ];
  return (
    <div className="table-wrap card">
      <table aria-label="Jobs side by side" className="compare-table">
        <thead>
          <tr>
            <th />
            {entries.map((e, i) => (
              <th key={e.key} scope="col">
                <span className="swatch" style={{ background: colorAt(i) }} aria-hidden="true" />
                {e.candidate ? (
                  <>
                    {e.candidate.name}
                    {many ? (
                      <div className="dim">
                        of <Link to={`/jobs/${e.job.id}`}>{jobLabel(e.job)}</Link>
                      </div>
                    ) : null}
                  </>
                ) : (
                  <>
                    <Link to={`/jobs/${e.job.id}`}>{jobLabel(e.job)}</Link>
                    {e.job.name && <div className="mono dim">{e.job.id}</div>}
                  </>
                )}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows.map(([name, cell]) => (
            <tr key={name}>
              <th scope="row">{name}</th>
              {entries.map((e) => (
                <td key={e.key}>{cell(e)}</td>
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

  // One job alone: a bake-off's candidates.
  const heading = <h1 className="jobs-title">{ids.length === 1 ? "Compare candidates" : "Compare jobs"}</h1>;
  const choose = (
    <>
      {heading}
      <p className="state">
        Choose two to {MAX_COMPARED} jobs to compare, or a bake-off to compare its candidates: tick them in the{" "}
        <Link to="/jobs">jobs list</Link>.
      </p>
    </>
  );
  if (ids.length < 1) return choose;
  const failed = [...jobs, ...metrics].find((q) => q.isError);
  if (failed) return <>{heading}<ErrorNote error={failed.error} /></>;
  if (jobs.some((q) => !q.data) || metrics.some((q) => !q.data)) return <>{heading}<Loading what="Loading the jobs" /></>;

  const loaded = jobs.map((q) => q.data!);
  const entries = entriesOf(loaded, metrics.map((q) => q.data!.data));
  if (entries.length < 2) return choose;
  const many = loaded.length > 1; // candidates say which job they are of
  const bakeoffs = loaded.filter(isBakeoff);
  return (
    <div className="job-compare">
      {heading}
      <p className="hint">
        Served figures are measured by serving each job's chosen checkpoint on held-out prompts; the trainer's
        curves and its eal are estimates.
        {bakeoffs.length > 0 &&
          ` A bake-off is shown by its candidates, served side by side on the same prompts (${bakeoffs.map(jobLabel).join(", ")}).`}
      </p>
      <FiguresTable entries={entries} many={many} />
      <div className="grid2 charts">
        <CompareChart entries={entries} many={many} title="Training loss" axis="step" data={merge(entries, (s) => s.loss, "step", "loss")} />
        <CompareChart
          entries={entries}
          many={many}
          title="Acceptance estimate (eal)"
          hint="The trainer's estimate (train/eal), not a served figure."
          axis="step"
          data={merge(entries, (s) => s.eal, "step", "eal")}
        />
        <CompareChart entries={entries} many={many} title="Validation loss per epoch" axis="epoch" data={merge(entries, (s) => s.validation, "epoch", "loss")} />
        <CompareChart
          entries={entries}
          many={many}
          title="Validation eal per epoch (estimate)"
          axis="epoch"
          data={merge(entries, (s) => s.validation, "epoch", "eal")}
        />
      </div>
    </div>
  );
}
