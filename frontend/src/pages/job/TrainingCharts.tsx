// The trainer's curves: loss and its acceptance estimate per step, per-position accuracy, and
// validation per epoch. All of them are the trainer's numbers (estimates), not served ones. In a
// bake-off each candidate's trainer counts its own steps: loss and eal have a line per candidate,
// the per-position and validation charts show the candidate chosen above them.
import { useState } from "react";
import { CartesianGrid, Legend, Line, LineChart, Tooltip, XAxis, YAxis } from "recharts";
import { AXIS, ChartCard, DOT, colorAt, tooltipNumber } from "./ChartCard";
import { mergeCandidates, type CandidateSeries, type Row, type TrainingSeries } from "./metrics";

function StepLine({ data, dataKey, name, color }: { data: Row[]; dataKey: string; name: string; color: string }) {
  return (
    <LineChart data={data} margin={{ top: 8, right: 12, bottom: 16, left: 0 }}>
      <CartesianGrid stroke="#eef1f5" />
      <XAxis dataKey="step" type="number" domain={["dataMin", "dataMax"]} tick={AXIS} label={{ value: "step", position: "insideBottom", offset: -8, ...AXIS }} />
      <YAxis tick={AXIS} width={48} domain={["auto", "auto"]} />
      <Tooltip formatter={tooltipNumber} labelFormatter={(step) => `step ${step}`} />
      <Line type="monotone" dataKey={dataKey} name={name} stroke={color} dot={DOT} isAnimationActive={false} />
    </LineChart>
  );
}

/** One line per candidate over the steps of its own trainer. */
function CandidateLines({ candidates, data, what }: { candidates: CandidateSeries[]; data: Row[]; what: string }) {
  return (
    <LineChart data={data} margin={{ top: 8, right: 12, bottom: 16, left: 0 }}>
      <CartesianGrid stroke="#eef1f5" />
      <XAxis dataKey="step" type="number" domain={["dataMin", "dataMax"]} tick={AXIS} label={{ value: "step", position: "insideBottom", offset: -8, ...AXIS }} />
      <YAxis tick={AXIS} width={48} domain={["auto", "auto"]} />
      <Tooltip formatter={tooltipNumber} labelFormatter={(step) => `step ${step}`} />
      <Legend wrapperStyle={{ fontSize: 12 }} verticalAlign="top" />
      {candidates.map((c) => (
        <Line
          key={c.index}
          type="monotone"
          dataKey={`c${c.index}`}
          name={`${c.name} ${what}`}
          stroke={colorAt(c.index)}
          dot={DOT}
          connectNulls
          isAnimationActive={false}
        />
      ))}
    </LineChart>
  );
}

export function TrainingCharts({
  series: whole,
  running,
  candidates,
  current,
}: {
  series: TrainingSeries;
  running: boolean;
  candidates?: CandidateSeries[]; // a bake-off's, each with its own series
  current?: string | null; // the candidate training now, shown first
}) {
  const bakeoff = candidates !== undefined && candidates.length > 1;
  const [picked, setPicked] = useState<number | null>(null);
  const fallback = candidates?.find((c) => c.name === current) ?? candidates?.[0];
  const shown = bakeoff ? (candidates.find((c) => c.index === picked) ?? fallback!) : null;
  const series = shown ? shown.series : whole;
  const waiting = running ? "yet" : "for this job";
  const waitingOf = shown ? `of ${shown.name}${running ? " yet" : ""}` : waiting;
  const loss = bakeoff ? mergeCandidates(candidates, (s) => s.loss, "step", "loss") : series.loss;
  const eal = bakeoff ? mergeCandidates(candidates, (s) => s.eal, "step", "eal") : series.eal;
  const of = shown ? ` of ${shown.name}` : "";
  return (
    <>
      {bakeoff && (
        <div className="field candidate-pick">
          <label htmlFor="training-candidate">Candidate</label>
          <select id="training-candidate" value={shown!.index} onChange={(e) => setPicked(Number(e.target.value))}>
            {candidates.map((c) => (
              <option key={c.index} value={c.index}>
                {c.name}
              </option>
            ))}
          </select>
          <small className="hint">Loss and eal have a line per candidate; the charts below them show this one.</small>
        </div>
      )}
    <div className="grid2 charts">
      <ChartCard label="Training loss" isEmpty={loss.length === 0} empty={`No training metrics ${waiting}.`}>
        {bakeoff ? (
          <CandidateLines candidates={candidates} data={loss} what="loss" />
        ) : (
          <StepLine data={series.loss} dataKey="loss" name="training loss" color={colorAt(0)} />
        )}
      </ChartCard>

      <ChartCard
        label="Acceptance estimate (eal)"
        hint="The trainer's estimate of the acceptance length (train/eal); the served evaluation measures the real one."
        isEmpty={eal.length === 0}
        empty={`No acceptance estimate ${waiting}.`}
      >
        {bakeoff ? (
          <CandidateLines candidates={candidates} data={eal} what="acceptance (estimate)" />
        ) : (
          <StepLine data={series.eal} dataKey="eal" name="acceptance length (estimate)" color={colorAt(1)} />
        )}
      </ChartCard>

      <ChartCard
        label="Per-position acceptance (training estimate)"
        hint={`The trainer's accuracy at each draft position (train/position_K_acc)${of}.`}
        isEmpty={series.positions.length === 0}
        empty={`No per-position metrics ${waitingOf}.`}
        height={260}
      >
        <LineChart data={series.positions} margin={{ top: 8, right: 12, bottom: 16, left: 0 }}>
          <CartesianGrid stroke="#eef1f5" />
          <XAxis dataKey="step" type="number" domain={["dataMin", "dataMax"]} tick={AXIS} />
          <YAxis tick={AXIS} width={48} domain={[0, 1]} />
          <Tooltip formatter={tooltipNumber} labelFormatter={(step) => `step ${step}`} />
          <Legend wrapperStyle={{ fontSize: 12 }} />
          {series.positionKeys.map((key, i) => (
            <Line
              key={key}
              type="monotone"
              dataKey={key}
              name={`position ${key.slice(1)}`}
              stroke={colorAt(i)}
              dot={DOT}
              strokeWidth={1.5}
              isAnimationActive={false}
            />
          ))}
        </LineChart>
      </ChartCard>

      <ChartCard
        label="Validation per epoch"
        hint={`Validation loss (left axis) and the trainer's eal estimate (right axis) after each epoch${of}.`}
        isEmpty={series.validation.length === 0}
        empty={running ? `No validation metrics${of} yet: they come after each epoch.` : `No validation metrics ${shown ? `of ${shown.name}` : "for this job"}.`}
        height={260}
      >
        <LineChart data={series.validation} margin={{ top: 8, right: 4, bottom: 16, left: 0 }}>
          <CartesianGrid stroke="#eef1f5" />
          <XAxis dataKey="epoch" type="number" domain={["dataMin", "dataMax"]} allowDecimals={false} tick={AXIS} label={{ value: "epoch", position: "insideBottom", offset: -8, ...AXIS }} />
          <YAxis yAxisId="loss" tick={AXIS} width={48} domain={["auto", "auto"]} />
          <YAxis yAxisId="eal" orientation="right" tick={AXIS} width={40} domain={["auto", "auto"]} />
          <Tooltip formatter={tooltipNumber} labelFormatter={(epoch) => `epoch ${epoch}`} />
          <Legend wrapperStyle={{ fontSize: 12 }} verticalAlign="top" />
          <Line yAxisId="loss" type="monotone" dataKey="loss" name="validation loss" stroke={colorAt(0)} dot={{ r: 3 }} isAnimationActive={false} connectNulls />
          <Line yAxisId="eal" type="monotone" dataKey="eal" name="acceptance length (estimate)" stroke={colorAt(1)} dot={{ r: 3 }} isAnimationActive={false} connectNulls />
        </LineChart>
      </ChartCard>
    </div>
    </>
  );
}
