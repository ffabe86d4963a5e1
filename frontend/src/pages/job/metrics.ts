// The trainer's metric rows (GET /api/jobs/{id}/metrics) shaped into chart series.
// Names as the trainer logs them: train/* per step (with its epoch), val/*_epoch per epoch
// (no step), eval/* once after the served evaluation (no step).
import type { Schemas } from "../../api/client";

type Metric = Schemas["MetricOut"];
export type Row = Record<string, number>;

const TRAIN_POSITION = /^train\/position_(\d+)_acc$/;
const EVAL_POSITION = /^eval\/acceptance_rate_pos_(\d+)$/;
const MAX_POINTS = 400; // per line; longer runs are thinned evenly (the last point kept)

/** At most `max` rows, evenly spaced, always keeping the last. */
function thin(rows: Row[], max = MAX_POINTS): Row[] {
  if (rows.length <= max) return rows;
  const every = rows.length / max;
  const kept: Row[] = [];
  for (let i = 0; i < max - 1; i++) kept.push(rows[Math.floor(i * every)]);
  kept.push(rows[rows.length - 1]);
  return kept;
}

/** Rows keyed by `axis` ("step" or "epoch"), one column per series name (the last value wins). */
function pivot(metrics: Metric[], axis: "step" | "epoch", column: (name: string) => string | null): Row[] {
  const rows = new Map<number, Row>();
  for (const m of metrics) {
    const x = m[axis];
    const key = column(m.name);
    if (x == null || key == null) continue;
    let row = rows.get(x);
    if (!row) rows.set(x, (row = { [axis]: x }));
    row[key] = m.value;
  }
  return [...rows.values()].sort((a, b) => a[axis] - b[axis]);
}

export interface TrainingSeries {
  loss: Row[]; // {step, loss}
  eal: Row[]; // {step, eal}
  positions: Row[]; // {step, p1, p2, ...}
  positionKeys: string[]; // "p1", "p2", ... in order
  validation: Row[]; // {epoch, loss, eal}
  servedPositions: Row[]; // {position, rate} from eval/acceptance_rate_pos_K
}

export function trainingSeries(metrics: Metric[]): TrainingSeries {
  const train = metrics.filter((m) => m.step != null && m.name.startsWith("train/"));
  const loss = pivot(train, "step", (n) => (n === "train/loss" ? "loss" : null));
  const eal = pivot(train, "step", (n) => (n === "train/eal" ? "eal" : null));
  const positionNumbers = new Set<number>();
  const positions = pivot(train, "step", (n) => {
    const match = TRAIN_POSITION.exec(n);
    if (!match) return null;
    positionNumbers.add(Number(match[1]));
    return `p${match[1]}`;
  });
  // Epochs counted from 1 on the chart, as everywhere on the page (the trainer's are from 0).
  const validation = pivot(
    metrics.filter((m) => m.step == null).map((m) => ({ ...m, epoch: m.epoch == null ? null : m.epoch + 1 })),
    "epoch",
    (n) => (n === "val/loss_epoch" ? "loss" : n === "val/eal_epoch" ? "eal" : null),
  );
  const servedPositions = metrics
    .map((m) => ({ match: EVAL_POSITION.exec(m.name), value: m.value }))
    .filter((x) => x.match)
    .map((x) => ({ position: Number(x.match![1]) + 1, rate: x.value }))
    .sort((a, b) => a.position - b.position);
  return {
    loss: thin(loss),
    eal: thin(eal),
    positions: thin(positions),
    positionKeys: [...positionNumbers].sort((a, b) => a - b).map((p) => `p${p}`),
    validation,
    servedPositions,
  };
}

/** A bake-off's candidate and its own series (its trainer's metrics: MetricOut.candidate). */
export interface CandidateSeries {
  name: string;
  index: number;
  series: TrainingSeries;
}

/** Each candidate's series, from the job's metrics (a metric without a candidate is the first's). */
export function candidateSeries(metrics: Metric[], candidates: { name: string; index: number }[]): CandidateSeries[] {
  return candidates.map((c) => ({
    name: c.name,
    index: c.index,
    series: trainingSeries(metrics.filter((m) => (m.candidate ?? 0) === c.index)),
  }));
}

/** One row per x value, one column per candidate (its key `c<index>`), from each one's rows. */
export function mergeCandidates(
  candidates: CandidateSeries[],
  pick: (s: TrainingSeries) => Row[],
  axis: string,
  column: string,
): Row[] {
  const rows = new Map<number, Row>();
  for (const c of candidates) {
    for (const point of pick(c.series)) {
      const x = point[axis];
      if (x == null || point[column] == null) continue;
      let row = rows.get(x);
      if (!row) rows.set(x, (row = { [axis]: x }));
      row[`c${c.index}`] = point[column];
    }
  }
  return [...rows.values()].sort((a, b) => a[axis] - b[axis]);
}
