// Live acceptance: what the engine's /metrics say about the drafter as it serves real traffic.
// The acceptance length over time, a line per drafter (a promotion or a rollback starts a new
// one) and per replica (dashed past replica 0), held against the acceptance length the drafter was evaluated at and the drift alert's
// threshold; the window's summary; the alert, when it is raised.
import { CartesianGrid, Legend, Line, LineChart, ReferenceLine, Tooltip, XAxis, YAxis } from "recharts";
import type { Deployment, LiveWindow } from "../../api/client";
import { Stat } from "../../components/stat";
import { ErrorNote, Loading } from "../../components/states";
import { AXIS, ChartCard, DOT, colorAt, tooltipNumber } from "../job/ChartCard";
import { num } from "../job/model";
import { DriftAlert } from "./DriftAlert";
import { shortId } from "./ids";
import { HISTORY_MS, runsOf, useLiveSeries, type Row, type Run } from "./live";

const EVALUATED = "#2b8a3e";
const ALERT = "#c92a2a";
const DASHES = ["6 3", "2 2", "8 3 2 3"]; // replicas 1, 2, 3, 4, ... (0 is solid)

/** 600 → "10 min", 21600 → "6 h". */
const span = (s: number) => (s % 3600 === 0 ? `${s / 3600} h` : s % 60 === 0 ? `${s / 60} min` : `${num(s, 0)} s`);
/** Times on the axis: with seconds when the chart spans less than ten minutes. */
function clockFor(rows: Row[]): (t: number) => string {
  const span = rows.length ? rows[rows.length - 1].t - rows[0].t : 0;
  const options: Intl.DateTimeFormatOptions =
    span < 600_000 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
  return (t) => new Date(t).toLocaleTimeString([], options);
}

function WindowStats({ window }: { window: LiveWindow }) {
  const rate = window.draft_acceptance_rate;
  return (
    <div className="stats">
      <Stat label="Acceptance length" value={num(window.acceptance_length, 2)} />
      <Stat label="Draft acceptance rate" value={rate == null ? "—" : `${num(rate * 100, 1)} %`} />
      <Stat label="Tokens / s" note={`all traffic, last ${span(window.seconds)}`} value={num(window.tokens_per_second, 1)} />
      <Stat label="Requests" value={num(window.requests, 0)} />
      <Stat label="Evaluated acceptance length" value={num(window.evaluated_acceptance_length, 2)} />
      <Stat label="Alert below" value={num(window.alert_below, 2)} />
    </div>
  );
}

function Chart({ runs, rows, window }: { runs: Run[]; rows: Row[]; window: LiveWindow }) {
  const keys = [...new Set(runs.map((r) => r.key))];
  const color = (key: string) => colorAt(keys.indexOf(key));
  const replicas = new Set(runs.map((r) => r.replica)).size > 1;
  const evaluated = window.evaluated_acceptance_length;
  const alertBelow = window.alert_below;
  const top = (max: number) => Math.ceil(Math.max(max, evaluated ?? 0) + 0.25);
  // From 1 (a drafter's least acceptance), or lower when the alert's threshold is: a weak
  // drafter's can be below 1, where the alert can never be raised, and the chart says so.
  const bottom = Math.floor(Math.min(1, alertBelow ?? 1) * 4) / 4;
  return (
    <LineChart data={rows} margin={{ top: 8, right: 12, bottom: 4, left: 0 }}>
      <CartesianGrid stroke="#eef1f5" />
      <XAxis
        dataKey="t"
        type="number"
        scale="time"
        domain={["dataMin", "dataMax"]}
        tick={AXIS}
        tickFormatter={clockFor(rows)}
      />
      <YAxis tick={AXIS} width={40} domain={[bottom, top]} allowDecimals />
      <Tooltip formatter={tooltipNumber} labelFormatter={(t) => new Date(Number(t)).toLocaleString()} />
      <Legend wrapperStyle={{ fontSize: 12 }} itemSorter={null} />
      {evaluated != null && (
        <ReferenceLine
          y={evaluated}
          stroke={EVALUATED}
          strokeDasharray="4 3"
          label={{ value: `evaluated ${num(evaluated, 2)}`, position: "insideTopRight", fontSize: 11, fill: EVALUATED }}
        />
      )}
      {alertBelow != null && (
        <ReferenceLine
          y={alertBelow}
          stroke={ALERT}
          strokeDasharray="2 3"
          label={{ value: `alert below ${num(alertBelow, 2)}`, position: "insideBottomRight", fontSize: 11, fill: ALERT }}
        />
      )}
      {runs.map((run) => (
        <Line
          key={run.dataKey}
          dataKey={run.dataKey}
          name={replicas ? `${shortId(run.key)} · replica ${run.replica}` : shortId(run.key)}
          legendType={run.first ? "line" : "none"}
          stroke={color(run.key)}
          strokeDasharray={run.replica ? DASHES[(run.replica - 1) % DASHES.length] : undefined}
          dot={DOT}
          strokeWidth={1.5}
          isAnimationActive={false}
        />
      ))}
    </LineChart>
  );
}

export function LiveAcceptance({ deployment }: { deployment: Deployment }) {
  const series = useLiveSeries(deployment);
  let body;
  if (series.isPending) body = <Loading what="Loading live acceptance" />;
  else if (!series.data) body = <ErrorNote error={series.error} retry={() => series.refetch()} />;
  else {
    const { points, window } = series.data;
    const { runs, rows } = runsOf(points);
    body = (
      <>
        <DriftAlert deployment={deployment} />
        <p className="hint">
          The last {span(window.seconds)} of{" "}
          {window.drafter === null || window.drafter === deployment.drafter
            ? "the drafter serving now"
            : "the previous drafter (the one serving now has no points yet)"}
          , weighted by drafts: {window.points} scrape{window.points === 1 ? "" : "s"} of the engine's /metrics,{" "}
          {num(window.num_drafts, 0)} drafts.
          {window.drafter !== null &&
            window.evaluated_acceptance_length == null &&
            " This drafter has no served evaluation to compare with: no drift alert."}
        </p>
        <WindowStats window={window} />
        {series.error && <ErrorNote error={series.error} retry={() => series.refetch()} />}
        <ChartCard
          label="Live acceptance length"
          hint={`Tokens per verifier pass at each scrape, over the last ${span(HISTORY_MS / 1000)}; a new line starts where the drafter changed, and each replica has its own.`}
          isEmpty={runs.length === 0}
          empty={
            deployment.status === "ready"
              ? "No drafted tokens yet: points appear once requests are served."
              : "No live acceptance recorded in this period."
          }
          height={260}
        >
          <Chart runs={runs} rows={rows} window={window} />
        </ChartCard>
      </>
    );
  }
  return (
    <section className="card live-acceptance" aria-labelledby="live-acceptance-title">
      <h2 id="live-acceptance-title">Live acceptance</h2>
      {body}
    </section>
  );
}
