// The served evaluation (job.evaluation): the drafter served on held-out prompts, beside n-gram
// drafting and no speculation. The served mean acceptance length is what decides the speedup;
// the trainer's eal is shown as what it is, an estimate.
import { Bar, BarChart, CartesianGrid, Cell, ReferenceLine, Tooltip, XAxis, YAxis } from "recharts";
import type { Checkpoint, Job } from "../../api/client";
import { Stat } from "../../components/stat";
import { Empty } from "../../components/states";
import { AXIS, ChartCard, colorAt, tooltipNumber } from "./ChartCard";
import type { Row } from "./metrics";
import { epochOf, evaluationOf, isBakeoff, isTerminal, num } from "./model";

const times = (x: number | null | undefined) => (x == null ? "—" : `×${num(x, 2)}`);

export function ServedAcceptance({
  job,
  checkpoints,
  servedPositions,
}: {
  job: Job;
  checkpoints: Checkpoint[] | undefined;
  servedPositions: Row[];
}) {
  const evaluation = evaluationOf(job.evaluation);
  let body;
  if (!evaluation) {
    let why = "No served evaluation yet: it runs after training.";
    if (job.evaluate === false) why = "This job skips the served evaluation (evaluate: false).";
    else if (isTerminal(job.status)) why = "No served evaluation: the job ended before it ran.";
    else if (job.stage === "evaluating")
      why = "Serving the trained drafter on held-out prompts now: the numbers appear when it is done.";
    body = <Empty>{why}</Empty>;
  } else {
    // The chosen checkpoint's own evaluation carries the per-position rates.
    const chosen = evaluationOf(checkpoints?.find((c) => c.id === evaluation.checkpoint_id)?.evaluation);
    const rates = chosen?.acceptance_rate_per_position ?? evaluation.acceptance_rate_per_position;
    const positions: Row[] = rates ? rates.map((rate, i) => ({ position: i + 1, rate })) : servedPositions;
    const bakeoff = isBakeoff(job) && evaluation.candidate != null;
    const lengths = [
      { name: bakeoff ? evaluation.candidate! : "trained drafter", value: evaluation.mean_acceptance_length },
      { name: "n-gram", value: evaluation.ngram_mean_acceptance_length },
      { name: "no speculation", value: 1 },
    ].filter((row): row is { name: string; value: number } => row.value != null);
    const estimate = evaluation.trainer_eal_estimate;
    const warnings = evaluation.warnings ?? [];
    body = (
      <>
        <p className="hint">
          {bakeoff && (
            <>
              {job.winner === evaluation.candidate ? "The winner, " : "The best ranked candidate, "}
              <strong>{evaluation.candidate}</strong> ({evaluation.kind}):{" "}
            </>
          )}
          The epoch {epochOf(evaluation.epoch)} checkpoint served on {evaluation.prompts ?? "?"} held-out prompts (
          {evaluation.prompt_source ?? "unknown source"}). The served mean acceptance length (tokens per verifier pass)
          decides the speedup; the trainer's eal is only its estimate.
        </p>
        <div className="stats">
          <Stat label="Served mean acceptance length" value={num(evaluation.mean_acceptance_length, 2)} />
          <Stat label="n-gram acceptance length" value={num(evaluation.ngram_mean_acceptance_length, 2)} />
          <Stat
            label={
              evaluation.speedup != null && evaluation.speedup_spread != null && (evaluation.rounds ?? 1) > 1
                ? `Speedup vs no speculation (±${num(evaluation.speedup_spread, 2)} over ${evaluation.rounds} rounds)`
                : "Speedup vs no speculation"
            }
            value={times(evaluation.speedup)}
          />
          <Stat label="n-gram speedup" value={times(evaluation.ngram_speedup)} />
          <Stat label="Trainer eal" note="estimate" value={num(estimate, 2)} />
          <Stat
            label="Outputs identical to baseline"
            value={evaluation.outputs_identical_to_baseline ?? "—"}
          />
        </div>
        {warnings.length > 0 && (
          <ul className="warnings" aria-label="Evaluation warnings">
            {warnings.map((w, i) => (
              <li key={i}>{w}</li>
            ))}
          </ul>
        )}
        <div className="grid2">
          <ChartCard label="Acceptance length" isEmpty={lengths.length === 0} empty="Not measured.">
            <BarChart data={lengths} margin={{ top: 16, right: 12, bottom: 4, left: 0 }}>
              <CartesianGrid stroke="#eef1f5" vertical={false} />
              <XAxis dataKey="name" tick={AXIS} interval={0} />
              <YAxis tick={AXIS} width={40} domain={[0, (max: number) => Math.ceil(Math.max(max, estimate ?? 0) + 0.5)]} />
              <Tooltip formatter={tooltipNumber} />
              <Bar dataKey="value" name="mean acceptance length" isAnimationActive={false}>
                {lengths.map((row, i) => (
                  <Cell key={row.name} fill={colorAt(i === 0 ? 0 : i === 1 ? 1 : 7)} />
                ))}
              </Bar>
              {estimate != null && (
                <ReferenceLine
                  y={estimate}
                  stroke="#ae3ec9"
                  strokeDasharray="4 3"
                  label={{ value: `trainer eal ${num(estimate, 2)} (estimate)`, position: "insideTopRight", fontSize: 11, fill: "#ae3ec9" }}
                />
              )}
            </BarChart>
          </ChartCard>
          <ChartCard
            label="Served acceptance per position"
            hint="How often the drafter's k-th token was accepted when served."
            isEmpty={positions.length === 0}
            empty="No per-position rates recorded."
          >
            <BarChart data={positions} margin={{ top: 16, right: 12, bottom: 16, left: 0 }}>
              <CartesianGrid stroke="#eef1f5" vertical={false} />
              <XAxis dataKey="position" tick={AXIS} label={{ value: "draft position", position: "insideBottom", offset: -8, ...AXIS }} />
              <YAxis tick={AXIS} width={40} domain={[0, 1]} />
              <Tooltip formatter={tooltipNumber} labelFormatter={(p) => `position ${p}`} />
              <Bar dataKey="rate" name="acceptance rate" fill={colorAt(4)} isAnimationActive={false} />
            </BarChart>
          </ChartCard>
        </div>
      </>
    );
  }
  return (
    <section className="card served" aria-label="Served acceptance">
      <h2>Served acceptance</h2>
      {body}
    </section>
  );
}
