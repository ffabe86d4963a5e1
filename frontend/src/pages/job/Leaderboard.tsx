// A bake-off's leaderboard (job.candidates, job.evaluation.leaderboard): every candidate with its
// status, its served figures once the evaluation has run, its rank and its training cost; the
// winner marked in words; a failed candidate's reason; ties; the baselines the speedups are
// measured against; speedup against training cost on a chart. It fills in as the job runs (the
// page refetches the job on each of its events). Deploy opens New deployment with the
// candidate's checkpoint, the winner's first.
import type { ReactNode } from "react";
import { Link, useNavigate } from "react-router-dom";
import {
  CartesianGrid,
  LabelList,
  Legend,
  ReferenceLine,
  Scatter,
  ScatterChart,
  Tooltip,
  XAxis,
  YAxis,
  ZAxis,
} from "recharts";
import type { Checkpoint } from "../../api/client";
import { Stat } from "../../components/stat";
import { StatusBadge } from "../../components/status";
import { duration } from "../../components/time";
import { AXIS, ChartCard, colorAt } from "./ChartCard";
import {
  KINDS,
  byRank,
  costOf,
  costUnit,
  deployableCheckpoint,
  isTerminal,
  leaderboardOf,
  num,
  settingsText,
  type Candidate,
  type Job,
} from "./model";

const times = (x: number | null | undefined) => (x == null ? "—" : `×${x.toFixed(2)}`);
const kindLabel = (kind: string) => KINDS.find((k) => k.kind === kind)?.label ?? kind;
const UNIT_WORDS: Record<string, string> = { "CPU s": "CPU", "GPU s": "GPU", "wall s": "wall" };

/** "×1.23 ±0.05", or "—" before it is measured. */
function speedupText(c: Candidate): string {
  if (c.speedup == null) return "—";
  return c.speedup_spread != null ? `${times(c.speedup)} ±${c.speedup_spread.toFixed(2)}` : times(c.speedup);
}

function Cost({ candidate, runtime }: { candidate: Candidate; runtime: string }) {
  const cost = costOf(candidate, runtime);
  if (!cost) return <span className="dim">{candidate.status === "training" ? "training…" : "—"}</span>;
  const wall = candidate.train_seconds;
  return (
    <span title={wall != null ? `trainer wall time ${duration(wall)}` : undefined}>
      {duration(cost.seconds)} {UNIT_WORDS[cost.unit] ?? cost.unit}
      {cost.unit !== "wall s" && wall != null && <div className="dim small">wall {duration(wall)}</div>}
    </span>
  );
}

function Lossless({ candidate }: { candidate: Candidate }) {
  if (candidate.lossless == null) return <span className="dim">—</span>;
  const same = candidate.outputs_identical_to_baseline;
  return candidate.lossless ? (
    <span>yes{same && <span className="dim"> ({same})</span>}</span>
  ) : (
    <span className="bad-text">no{same && <span> ({same} identical)</span>}</span>
  );
}

function CandidateCell({ candidate }: { candidate: Candidate }) {
  const failed = candidate.status === "failed" || candidate.status === "stopped";
  return (
    <>
      <strong className="cand-name">{candidate.name}</strong>{" "}
      {candidate.winner && (
        <span className="badge good" data-testid="winner-badge" title="The fastest lossless candidate that passes the gate">
          winner
        </span>
      )}
      <div className="dim small">{settingsText(candidate.settings, candidate.kind)}</div>
      {candidate.tied_with.length > 0 && (
        <div className="small tie" title="Their speedups are within each other's spread: the tie is broken by served acceptance length, then training cost">
          tied with {candidate.tied_with.join(", ")}
        </div>
      )}
      {candidate.gate_passed === false && <div className="small bad-text">fails the acceptance gate</div>}
      {failed && (candidate.status_reason || candidate.error_code) && (
        <div className="field-error cand-reason">
          {candidate.error_code && <code>{candidate.error_code}</code>} {candidate.status_reason}
        </div>
      )}
      {candidate.log_tail && (
        <details className="cand-log">
          <summary>Last log lines</summary>
          <pre className="log">{candidate.log_tail}</pre>
        </details>
      )}
    </>
  );
}

/** A cell with its column's name (shown beside the value when the rows stack on a phone). */
function Cell({ label, className, children }: { label: string; className?: string; children: ReactNode }) {
  return (
    <td role="cell" data-label={label} className={className}>
      <div>{children}</div>
    </td>
  );
}

function Row({ candidate, job, checkpoints }: { candidate: Candidate; job: Job; checkpoints?: Checkpoint[] }) {
  const navigate = useNavigate();
  const checkpoint = deployableCheckpoint(candidate, checkpoints);
  return (
    <tr role="row" className={candidate.winner ? "winner" : candidate.status === "failed" ? "failed" : undefined} data-candidate={candidate.name}>
      <Cell label="Rank" className="rank">
        {candidate.rank != null ? <strong>#{candidate.rank}</strong> : <span className="dim">—</span>}
        {candidate.rank != null && candidate.tied_with.length > 0 && <span className="dim small"> (tie)</span>}
      </Cell>
      <Cell label="Candidate">
        <CandidateCell candidate={candidate} />
      </Cell>
      <Cell label="Kind">{kindLabel(candidate.kind)}</Cell>
      <Cell label="Status">
        <StatusBadge status={candidate.status} />
      </Cell>
      <Cell label="Speedup" className="num">
        {speedupText(candidate)}
      </Cell>
      <Cell label="Served AL" className="num">
        {num(candidate.served_acceptance_length, 2)}
      </Cell>
      <Cell label="Lossless">
        <Lossless candidate={candidate} />
      </Cell>
      <Cell label="Training cost" className="num">
        <Cost candidate={candidate} runtime={job.runtime} />
      </Cell>
      <Cell label="Deploy" className="cand-actions">
        {checkpoint ? (
          <button
            type="button"
            className={`small${candidate.winner ? " primary" : ""}`}
            aria-label={`Deploy candidate ${candidate.name}`}
            title={`New deployment of checkpoint ${checkpoint}`}
            onClick={() => navigate(`/deployments/new?checkpoint=${encodeURIComponent(checkpoint)}`)}
          >
            Deploy
          </button>
        ) : (
          <span className="dim small">no checkpoint yet</span>
        )}
      </Cell>
    </tr>
  );
}

/** Where the ranking stands, in a sentence. */
function Headline({ job, checkpoints }: { job: Job; checkpoints?: Checkpoint[] }) {
  const navigate = useNavigate();
  const winner = job.candidates.find((c) => c.winner);
  const evaluated = job.candidates.filter((c) => c.rank != null).length;
  const total = job.candidates.length;
  if (winner) {
    const checkpoint = deployableCheckpoint(winner, checkpoints);
    return (
      <div className="state winner-note" role="status" data-testid="leaderboard-winner">
        <span>
          Winner: <strong>{winner.name}</strong> ({kindLabel(winner.kind)}):{" "}
          {winner.speedup != null ? `${speedupText(winner)} the output tokens/s of the verifier alone, ` : ""}served
          acceptance length {num(winner.served_acceptance_length, 2)}
          {winner.lossless ? ", lossless" : ""}.
        </span>
        {checkpoint && (
          <button
            type="button"
            className="primary small"
            onClick={() => navigate(`/deployments/new?checkpoint=${encodeURIComponent(checkpoint)}`)}
          >
            Deploy the winner
          </button>
        )}
      </div>
    );
  }
  let text: string;
  if (job.evaluate === false) text = "This job skips the served evaluation: its candidates are trained but not ranked.";
  else if (evaluated > 0)
    text = `No winner: no candidate is both lossless and passes the acceptance gate. ${byRank(job.candidates)[0].name} ranks first.`;
  else if (isTerminal(job.status)) text = "The job ended before its candidates were served and ranked.";
  else {
    const trained = job.candidates.filter((c) => ["trained", "evaluated"].includes(c.status)).length;
    text =
      job.stage === "evaluating"
        ? `Serving the ${total} candidates side by side on the same prompts: the ranks come when it is done.`
        : `${trained} of ${total} candidates trained; they are ranked once all are served side by side.`;
  }
  return (
    <div className="state winner-note" role="status" data-testid="leaderboard-winner">
      {text}
    </div>
  );
}

function Baselines({ job }: { job: Job }) {
  const board = leaderboardOf(job);
  const b = board?.baselines;
  if (!b) return null;
  const tokens = (x: number | null | undefined) => (x == null ? "—" : `${num(x, 1)} tok/s`);
  return (
    <div className="stats" role="group" aria-label="Baselines">
      <Stat label="No speculation (verifier alone)" value={tokens(b.no_speculation)} />
      <Stat label="n-gram drafting" value={tokens(b.ngram)} />
      <Stat label="n-gram speedup" value={times(b.ngram_speedup)} />
      <Stat label="n-gram acceptance length" value={num(b.ngram_mean_acceptance_length, 2)} />
      {board?.rounds != null && <Stat label="Rounds (speedup = median)" value={String(board.rounds)} />}
    </div>
  );
}

interface Point {
  name: string;
  cost: number;
  y: number;
  spread: number | null;
}

/** Speedup (or, with no baseline measured, served acceptance length) against training cost. */
function CostChart({ job }: { job: Job }) {
  const unit = costUnit(job);
  // Speedups need the verifier alone served beside the candidates (evaluate.baseline).
  const baseline = job.evaluate !== false && (job.evaluate as { baseline?: boolean }).baseline !== false;
  const withSpeedup = baseline || job.candidates.some((c) => c.speedup != null);
  const metric = withSpeedup ? "speedup" : "served acceptance length";
  const points = (winner: boolean): Point[] =>
    job.candidates
      .filter((c) => c.winner === winner)
      .map((c) => {
        const cost = costOf(c, job.runtime);
        const y = withSpeedup ? c.speedup : c.served_acceptance_length;
        return cost && y != null ? { name: c.name, cost: cost.seconds, y, spread: withSpeedup ? c.speedup_spread : null } : null;
      })
      .filter((p): p is Point => p !== null);
  const others = points(false);
  const winners = points(true);
  const ngram = leaderboardOf(job)?.baselines?.ngram_speedup;
  // Round ticks from 0 to a little above the highest point (and above ×1, the verifier alone).
  const top = Math.max(withSpeedup ? 1 : 0, ngram ?? 0, ...[...others, ...winners].map((p) => p.y)) * 1.15;
  const step = top <= 1.5 ? 0.25 : top <= 3 ? 0.5 : top <= 6 ? 1 : 2;
  const yTicks = Array.from({ length: Math.ceil(top / step) + 1 }, (_, i) => i * step);
  const label = `${withSpeedup ? "Speedup" : "Served acceptance length"} against training cost`;
  return (
    <ChartCard
      label={label}
      hint={
        withSpeedup
          ? `Each candidate's speedup over the verifier alone (the median of the rounds) against what its training cost (${unit.replace(" s", " seconds")}). Up and to the left is better.`
          : `No speedup measured (the evaluation ran without the verifier alone): served acceptance length against training cost (${unit.replace(" s", " seconds")}).`
      }
      isEmpty={others.length + winners.length === 0}
      empty="The chart fills in once candidates are trained and served."
      height={260}
    >
      <ScatterChart margin={{ top: 20, right: 24, bottom: 20, left: 0 }}>
        <CartesianGrid stroke="#eef1f5" />
        <XAxis
          type="number"
          dataKey="cost"
          name={`training cost (${unit})`}
          tick={AXIS}
          domain={[0, "auto"]}
          padding={{ left: 8, right: 36 }}
          tickFormatter={(s: number) => duration(s)}
          label={{ value: `training cost (${UNIT_WORDS[unit] ?? unit} time)`, position: "insideBottom", offset: -12, ...AXIS }}
        />
        <YAxis type="number" dataKey="y" name={metric} tick={AXIS} width={44} domain={[0, yTicks[yTicks.length - 1]]} ticks={yTicks} />
        <ZAxis range={[90, 90]} />
        <Tooltip
          cursor={{ strokeDasharray: "3 3" }}
          formatter={(value: unknown, name: unknown) => [typeof value === "number" ? num(value, 2) : String(value), String(name)]}
        />
        <Legend wrapperStyle={{ fontSize: 12 }} verticalAlign="top" />
        {withSpeedup && (
          <ReferenceLine y={1} stroke="#868e96" strokeDasharray="4 3" label={{ value: "no speculation ×1", position: "insideBottomLeft", fontSize: 11, fill: "#5d6878" }} />
        )}
        {withSpeedup && ngram != null && (
          <ReferenceLine y={ngram} stroke={colorAt(1)} strokeDasharray="4 3" label={{ value: `n-gram ${times(ngram)}`, position: "insideTopRight", fontSize: 11, fill: colorAt(1) }} />
        )}
        <Scatter name="candidates" data={others} fill={colorAt(0)} isAnimationActive={false}>
          <LabelList dataKey="name" position="top" style={{ fontSize: 11, fill: "#1c2330" }} />
        </Scatter>
        {winners.length > 0 && (
          <Scatter name="winner" data={winners} fill={colorAt(2)} shape="star" isAnimationActive={false}>
            <LabelList dataKey="name" position="top" style={{ fontSize: 11, fontWeight: 700, fill: "#2b8a3e" }} formatter={(name: unknown) => `${String(name)} (winner)`} />
          </Scatter>
        )}
      </ScatterChart>
    </ChartCard>
  );
}

export function LeaderboardSection({ job, checkpoints }: { job: Job; checkpoints?: Checkpoint[] }) {
  const rows = byRank(job.candidates);
  const rounds = leaderboardOf(job)?.rounds ?? (job.evaluate ? (job.evaluate as { rounds?: number }).rounds : undefined) ?? 3;
  const evaluated = job.candidates.filter((c) => c.status === "evaluated").length;
  return (
    <section className="card leaderboard" aria-labelledby="leaderboard-title">
      <div className="section-head">
        <h2 id="leaderboard-title">Leaderboard</h2>
        <span className="dim small" data-testid="leaderboard-count">
          {job.candidates.length} candidates · {evaluated} evaluated
        </span>
        <Link className="cand-compare" to={`/jobs/compare?ids=${job.id}`}>
          Compare the candidates
        </Link>
      </div>
      <p className="hint">
        The candidates train one after another on the same data, then are served side by side on the same held-out
        prompts, {rounds} round{rounds === 1 ? "" : "s"}. Ranked by speedup (the median of the rounds, ± their range); a lead
        within the spread is a tie, broken by served acceptance length, then training cost. Only a lossless candidate that
        passes the gate can win.
      </p>
      <Headline job={job} checkpoints={checkpoints} />
      <Baselines job={job} />
      <div className="table-wrap">
        <table role="table" aria-label="Leaderboard" className="leaderboard-table">
          <thead>
            <tr role="row">
              <th role="columnheader">Rank</th>
              <th role="columnheader">Candidate</th>
              <th role="columnheader">Kind</th>
              <th role="columnheader">Status</th>
              <th role="columnheader" className="num" title="Output tokens/s over the verifier alone's: median of the rounds ± their range">
                Speedup
              </th>
              <th role="columnheader" className="num" title="Mean acceptance length measured by serving it">
                Served AL
              </th>
              <th role="columnheader" title="Every output token-identical to the verifier alone's">
                Lossless
              </th>
              <th role="columnheader" className="num">
                Training cost
              </th>
              <th role="columnheader">
                <span className="sr-only">Deploy</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {rows.map((c) => (
              <Row key={c.index} candidate={c} job={job} checkpoints={checkpoints} />
            ))}
          </tbody>
        </table>
      </div>
      <CostChart job={job} />
    </section>
  );
}
